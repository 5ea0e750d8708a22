"""The core's token logprobs (`specdec.sampling.token_logprobs.TokenLogprob`) as OpenAI's `logprobs`
objects (`specdec_http.protocol.logprobs`), for one request: completions' parallel lists with
text offsets running on across a stream's chunks, or chat's token objects."""

from __future__ import annotations

import math
from collections.abc import Callable

from specdec.sampling.token_logprobs import TokenLogprob
from specdec_http.protocol.logprobs import ChatLogprobs, ChatTokenLogprob, CompletionLogprobs, TopLogprob

REMOVED_LOGPROB = -9999.0  # a token the request's top-k / top-p removed (JSON has no -inf; as vLLM)


class LogprobsFormat:
    """One request's logprobs formatting: `token_text` decodes one token id; `offset` is
    where the next token's text starts in the choice's text."""

    def __init__(self, token_text: Callable[[int], str], offset: int = 0) -> None:
        self._token_text = token_text
        self._texts: dict[int, str] = {}
        self.offset = offset

    def text(self, token_id: int) -> str:
        if token_id not in self._texts:
            self._texts[token_id] = self._token_text(token_id)
        return self._texts[token_id]

    def completion(self, logprobs: list[TokenLogprob]) -> CompletionLogprobs:
        """Completions' shape; advances `offset` past these tokens."""
        tokens = [self.text(t.token_id) for t in logprobs]
        offsets = []
        for text in tokens:
            offsets.append(self.offset)
            self.offset += len(text)
        return CompletionLogprobs(
            tokens=tokens, token_logprobs=[_finite(t.logprob) for t in logprobs],
            top_logprobs=[{self.text(i): _finite(v) for i, v in t.top} for t in logprobs], text_offset=offsets,
        )

    def prompt(self, token_ids: list[int], logprobs: list[TokenLogprob | None]) -> CompletionLogprobs:
        """An echoed prompt's tokens in completions' shape (the first token, which has no
        logprob, is null in token_logprobs and top_logprobs); advances `offset`."""
        scored = self.completion([TokenLogprob(t, 0.0) if lp is None else lp for t, lp in zip(token_ids, logprobs)])
        for i, entry in enumerate(logprobs):
            if entry is None:
                scored.token_logprobs[i] = scored.top_logprobs[i] = None
        return scored

    @staticmethod
    def joined(first: CompletionLogprobs, then: CompletionLogprobs) -> CompletionLogprobs:
        """Two runs of tokens as one (an echoed prompt, then the completion)."""
        return CompletionLogprobs(**{name: getattr(first, name) + getattr(then, name)
                                     for name in CompletionLogprobs.model_fields})

    def chat(self, logprobs: list[TokenLogprob]) -> ChatLogprobs:
        """Chat's shape."""
        return ChatLogprobs(content=[
            ChatTokenLogprob(**self._top(t.token_id, t.logprob), top_logprobs=[TopLogprob(**self._top(i, v))
                                                                               for i, v in t.top])
            for t in logprobs
        ])

    def _top(self, token_id: int, logprob: float) -> dict:
        text = self.text(token_id)
        return {"token": text, "logprob": _finite(logprob), "bytes": list(text.encode("utf-8", "replace"))}


def _finite(logprob: float) -> float:
    return logprob if math.isfinite(logprob) else REMOVED_LOGPROB
