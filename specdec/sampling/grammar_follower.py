"""A served draft's grammars: per sequence a matcher that follows the history the router sends.

In-process, each proposal request carries a cursor on the row's own matcher (`GrammarCursor`,
`GrammarRow.cursor`). A draft worker behind gRPC cannot be handed that matcher: the router
sends the grammar's spec once (worker.proto's `HistoryDelta.grammar`) and the worker keeps a
matcher of its own per sequence (`GrammarFollower`). It follows the sequence's history as
the deltas rewrite it: it advances along the tokens after the prompt that the router has
emitted (every one of them allowed: the target enforces the grammar), rolls back where a
delta truncates the history, and hands the proposer what the in-process draft gets, a
`GrammarCursor` at that point (forked when the proposer walks it: the matcher moves only in
the next `follow`); the proposer drafts under it exactly as in-process.
The matcher is the only state kept: no tokens are copied (the history is the worker's own).

`GrammarFollowers` keeps them by seq_id: it compiles each sequence's grammar through the
worker's backend (once per distinct grammar: the backend's cache), records a grammar that
does not compile as that sequence's failure (logged once; it drafts nothing until it is
released: a request only affects itself), and frees a sequence's matcher with it.
"""

from __future__ import annotations

import logging

from specdec.sampling.grammar_cursor import GrammarCursor
from specdec.sampling.grammar_matcher import Grammar, GrammarBackend, GrammarMatcher

logger = logging.getLogger(__name__)


class GrammarFollower:
    """One sequence's matcher on a worker that holds its history: the grammar starts after the
    first `start` history tokens (the prompt); `length` history tokens are behind the matcher."""

    def __init__(self, matcher: GrammarMatcher, start: int, vocab_size: int) -> None:
        self._matcher = matcher
        self.start = start
        self.vocab_size = vocab_size
        self.length = start  # the matcher accepted history[start:length]
        self._stopped = False  # the grammar refused history[length] (or had ended before it)

    def follow(self, history: list[int], kept: int, confirmed: int) -> None:
        """Move to the first `confirmed` tokens of `history` (those the target has emitted: not
        a look-ahead's unverified drafts), of which the first `kept` are the same as at the
        last move (the delta's offset): roll back past `kept`, then advance, stopping before a
        token the grammar refuses (the cursor then masks nothing)."""
        keep = max(self.start, min(kept, confirmed, self.length))
        if keep < self.length:
            self._matcher.rollback(self.length - keep)
            self.length = keep
        if kept <= self.length:
            self._stopped = False  # the token it stopped before may have changed
        while not self._stopped and self.length < confirmed:
            if self._matcher.ended or not self._matcher.accept(history[self.length]):
                self._stopped = True
            else:
                self.length += 1

    def cursor(self) -> GrammarCursor | None:
        """A cursor at the followed history's end for the proposer; None (it drafts unmasked, as
        a cursor that cannot follow does) where the history left the grammar."""
        if self._stopped:
            return None
        return GrammarCursor(self._matcher, self.length, self.vocab_size, shared=True)  # forked when walked


class GrammarFollowers:
    """A draft worker's grammars by seq_id, compiled by `backend` (None: the worker has no
    grammar engine, and every grammar fails its sequence) for logits of vocab_size tokens."""

    def __init__(self, backend: GrammarBackend | None, vocab_size: int) -> None:
        self._backend = backend
        self.vocab_size = vocab_size
        self._followers: dict[str, GrammarFollower] = {}
        self._failed: dict[str, str] = {}  # seq_id -> why its grammar failed

    def __len__(self) -> int:
        return len(self._followers)

    def __contains__(self, seq_id: str) -> bool:
        return seq_id in self._followers

    def start(self, seq_id: str, spec: Grammar, start: int) -> None:
        """The sequence's grammar arrived: a fresh matcher at its start (after `start` prompt
        tokens), replacing any it had. One that does not compile is the sequence's failure."""
        self.release(seq_id)
        try:
            if self._backend is None:
                raise ValueError("this worker has no grammar engine")
            matcher = self._backend.matcher(spec, self.vocab_size)
        except Exception as exc:  # noqa: BLE001 (any failure is the sequence's alone)
            self._fail(seq_id, exc)
            return
        self._followers[seq_id] = GrammarFollower(matcher, start, self.vocab_size)

    def failed(self, seq_id: str) -> str | None:
        """Why the sequence's grammar failed (it drafts nothing), or None."""
        return self._failed.get(seq_id)

    def cursor(self, seq_id: str, history: list[int], kept: int, confirmed: int) -> GrammarCursor | None:
        """The sequence's matcher moved along its new history (`GrammarFollower.follow`) and
        a cursor on it for the proposer; None when it has no grammar (or its grammar failed: `failed`,
        which a matcher that raises while following becomes too)."""
        follower = self._followers.get(seq_id)
        if follower is None:
            return None
        try:
            follower.follow(history, kept, confirmed)
            return follower.cursor()
        except Exception as exc:  # noqa: BLE001
            self.release(seq_id)
            self._fail(seq_id, exc)
            return None

    def _fail(self, seq_id: str, exc: Exception) -> None:
        self._failed[seq_id] = f"{type(exc).__name__}: {exc}"
        logger.warning("sequence %s: its grammar failed, it drafts nothing until released: %s",
                       seq_id, self._failed[seq_id])

    def release(self, seq_id: str) -> None:
        """Forget the sequence's matcher and any failure (unknown ids are ignored)."""
        self._followers.pop(seq_id, None)
        self._failed.pop(seq_id, None)
