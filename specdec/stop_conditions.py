"""When a sequence is finished: max_new_tokens, end-of-sequence token, stop strings."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

FINISH_LENGTH = "length"  # max_new_tokens reached
FINISH_STOP = "stop"  # EOS token or a stop string


@dataclass
class StopDecision:
    finish_reason: str | None  # None = keep going
    num_tokens: int  # how many of the generated tokens to keep


class StopChecker:
    """Decides, after each round, whether and where a sequence's output ends.

    A round may emit several tokens at once; the output is cut at the first stop.
    The EOS token is kept in token_ids (as transformers' generate() does). Stop strings are
    matched on the decoded text; the output keeps the token that completed the match and
    `text_before_stop` gives the text cut before the stop string.
    """

    def __init__(
        self,
        max_new_tokens: int,
        eos_token_ids: Sequence[int] = (),
        stop: Sequence[str] = (),
        decode: Callable[[list[int]], str] | None = None,
    ) -> None:
        if stop and decode is None:
            raise ValueError("stop strings need a tokenizer to decode the output")
        self.max_new_tokens = max_new_tokens
        self.eos_token_ids = frozenset(eos_token_ids)
        self.stop = tuple(stop)
        self.decode = decode

    def check(self, output_ids: list[int], num_new: int) -> StopDecision:
        """output_ids: all generated tokens; the last `num_new` arrived in this round."""
        first_new = len(output_ids) - num_new
        for i in range(first_new, len(output_ids)):
            if i + 1 >= self.max_new_tokens or output_ids[i] in self.eos_token_ids:
                reason = FINISH_STOP if output_ids[i] in self.eos_token_ids else FINISH_LENGTH
                stop_at = self._stop_string_end(output_ids[: i + 1], first_new)
                return StopDecision(FINISH_STOP, stop_at) if stop_at else StopDecision(reason, i + 1)
        stop_at = self._stop_string_end(output_ids, first_new)
        return StopDecision(FINISH_STOP, stop_at) if stop_at else StopDecision(None, len(output_ids))

    def _stop_string_end(self, output_ids: list[int], first_new: int) -> int:
        """Smallest n > first_new such that output_ids[:n] contains a stop string (0 if none)."""
        if not self.stop or not any(s in self.decode(output_ids) for s in self.stop):
            return 0
        for n in range(first_new + 1, len(output_ids) + 1):
            text = self.decode(output_ids[:n])
            if any(s in text for s in self.stop):
                return n
        return 0

    def text_before_stop(self, text: str) -> str:
        cut = min((text.find(s) for s in self.stop if s in text), default=-1)
        return text if cut < 0 else text[:cut]
