"""When a sequence is finished: max_new_tokens, end-of-sequence token, stop strings.

A `StopChecker` follows one sequence. Each round it gets the tokens the round emitted and
decides how many of them to keep, whether the sequence is finished, and which new text the
client may see. Its cost per round depends on the round (tokens, stop strings), never on how
long the output already is: text comes from an `IncrementalDetokenizer`, and stop strings are
searched only where a new match can be: the new text plus the last (longest stop - 1)
characters before it.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from specdec.requests.detokenizer import IncrementalDetokenizer, TextPieces

FINISH_LENGTH = "length"  # max_new_tokens reached
FINISH_STOP = "stop"  # EOS token or a stop string


@dataclass
class StopDecision:
    finish_reason: str | None  # None = keep going; FINISH_LENGTH or FINISH_STOP
    num_kept: int  # how many of this round's new tokens stay in the output
    text: str  # new text for the client: stable, and cut before a stop string


class StopChecker:
    """Decides, round by round, whether and where a sequence's output ends.

    Tokens are examined in order and the output is cut at the first stop condition: the
    max_new_tokens-th token (finish "length"), an EOS token (finish "stop"; kept in the output,
    as transformers' generate() does), or the token that completes a stop string in the decoded
    text (finish "stop"; that token is kept, the text is cut before the stop string). A stop
    string completed by the same token as max_new_tokens or EOS wins: finish "stop", text cut.

    Text handed out (StopDecision.text) is stable: it never ends in a partial character and never
    includes any part of a stop string, so a suffix that could still grow into one is held back
    until the next round shows it does not. The pieces add up to `text`: decode(kept ids), cut
    before the first stop string that matched.
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
        self._stop_set = frozenset(stop)
        self._stops_sorted = sorted(self._stop_set)  # for "is x a prefix of some stop?"
        self._stop_lengths = sorted({len(s) for s in self._stop_set})  # ascending
        self._context = max(0, max(self._stop_lengths, default=0) - 1)  # chars before new text to search
        self._detok = IncrementalDetokenizer(decode) if decode is not None else None
        self._num_tokens = 0
        self._finished = False
        self._tail = ""  # last `_context` chars of the stable text (no stop string in it)
        self._unreleased = ""  # stable text not handed out yet (held back at the last round)
        self._stable_len = 0  # chars of stable text so far
        self._released = TextPieces()  # every piece handed out

    @property
    def text(self) -> str:
        """All text handed out so far (after finishing: the final, stop-cut text). Joins the pieces
        on demand: O(length) when new text arrived since the last call; the per-round text is in
        StopDecision.text."""
        return self._released.text

    @property
    def num_tokens(self) -> int:
        """Tokens kept so far."""
        return self._num_tokens

    @property
    def finished(self) -> bool:
        """Whether a stop condition was met (append() may not be called any more)."""
        return self._finished

    def append(self, new_ids: list[int]) -> StopDecision:
        """Take one round's emitted tokens; keep them up to the first stop condition."""
        if self._finished:
            raise RuntimeError("append() on a finished sequence")
        for k, token_id in enumerate(new_ids):
            self._num_tokens += 1
            cut = self._push(token_id)  # absolute char position of a stop string, or None
            if cut is not None:
                return self._finish(FINISH_STOP, k + 1, cut)
            if token_id in self.eos_token_ids:
                return self._finish(FINISH_STOP, k + 1, None)
            if self._num_tokens >= self.max_new_tokens:
                return self._finish(FINISH_LENGTH, k + 1, None)
        return StopDecision(None, len(new_ids), self._release(self._held_back_start()))

    def _push(self, token_id: int) -> int | None:
        """Decode one more token; return where (absolute char offset into the output text) the
        first stop string starts if the text now holds one, else None."""
        if self._detok is None:
            return None
        stable = self._detok.push(token_id)
        if not self._stop_set:  # nothing to search for: no window to build
            self._unreleased += stable
            self._stable_len += len(stable)
            return None
        # The output text is now (stable text before) + stable + pending. A new stop string match
        # ends in stable + pending and is at most `_context + 1` chars long.
        window_start = self._stable_len - len(self._tail)  # absolute offset of window[0]
        window = self._tail + stable + self._detok.pending
        self._unreleased += stable
        self._stable_len += len(stable)
        self._tail = (self._tail + stable)[max(0, len(self._tail) + len(stable) - self._context) :]
        match = self._find_stop(window)
        return None if match is None else window_start + match

    def _find_stop(self, window: str) -> int | None:
        """Earliest position in `window` where a stop string starts (None if none).
        Cost: len(window) x (distinct stop lengths) set lookups."""
        if not self._stop_set:
            return None
        for start in range(len(window) + 1):
            for length in self._stop_lengths:
                if start + length > len(window):
                    break
                if window[start : start + length] in self._stop_set:
                    return start
        return None

    def _held_back_start(self) -> int:
        """Index into `_unreleased` where a suffix that is a proper prefix of a stop string begins
        (len(_unreleased) if none): that suffix could still become a stop string."""
        text = self._unreleased
        for start in range(max(0, len(text) - self._context), len(text)):
            if self._is_stop_prefix(text[start:]):
                return start
        return len(text)

    def _is_stop_prefix(self, fragment: str) -> bool:
        """Does some stop string start with `fragment`? (binary search in the sorted stops)"""
        i = bisect.bisect_left(self._stops_sorted, fragment)
        return i < len(self._stops_sorted) and self._stops_sorted[i].startswith(fragment)

    def _release(self, end: int) -> str:
        """Hand out `_unreleased[:end]`; keep the rest back."""
        piece, self._unreleased = self._unreleased[:end], self._unreleased[end:]
        self._released.append(piece)
        return piece

    def _finish(self, reason: str, num_kept: int, cut: int | None) -> StopDecision:
        """End the sequence: release all remaining text (flushing the detokenizer), or only the
        text before `cut` (absolute char offset where the stop string starts)."""
        self._finished = True
        released_len = self._stable_len - len(self._unreleased)  # chars handed out before
        if self._detok is not None:
            self._unreleased += self._detok.flush()
        end = len(self._unreleased) if cut is None else cut - released_len
        text = self._release(end)
        self._unreleased = ""
        return StopDecision(reason, num_kept, text)
