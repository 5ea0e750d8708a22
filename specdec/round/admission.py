"""Admission: which waiting requests join the batch now, by the cache's room for their reserves.

Strict arrival order leaves memory idle: a long request at the head whose reserve (prompt +
max_new_tokens) does not fit yet holds back every shorter request behind it that would. Here a
waiting request that fits may go past the ones ahead of it that do not, but not forever: each
passed-over request counts the reserve tokens admitted past it, and once that reaches its own
reserve it stops all further passing until it is admitted itself (the memory frees as running
requests finish). So a long request waits, beyond what arrival order would make it wait, at most
for memory it needs itself to free once more; no knob, the bound scales with the request.

Nothing is admitted beyond what the cache allows: every choice is checked with `admits` on the
whole admitted list (sequences already taking blocks first, then the choices so far, in order).
The order of admission never changes a request's tokens (each row's output depends on its own
history only), only when it starts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence


class Admission:
    """Chooses the waiting requests to admit each step (arrival order, with bounded passing)."""

    def __init__(self) -> None:
        self._passed: dict[str, int] = {}  # waiting seq_id -> reserve tokens admitted past it so far

    def passed(self, seq_id: str) -> int:
        """Reserve tokens admitted past this waiting request (0 once admitted or never passed)."""
        return self._passed.get(seq_id, 0)

    def forget(self, seq_id: str) -> None:
        """The request left the queue other than by admission (aborted): nothing passed it any more."""
        self._passed.pop(seq_id, None)

    def choose(self, admits: Callable[[list[int]], int], taken: Sequence[int],
               waiting: Sequence[tuple[str, int]]) -> list[int]:
        """Indices into ``waiting`` ((seq_id, reserve tokens), in arrival order) to admit now.
        admits: how many of the given reserves, in order, the cache can hold now; taken: the
        reserves of admitted sequences that do not hold their blocks yet (counted first)."""
        reserves, chosen, skipped = list(taken), [], []
        too_big = None  # the smallest reserve found not to fit: larger ones cannot either
        for i, (seq_id, reserve) in enumerate(waiting):
            if any(self.passed(passed_id) >= budget for passed_id, budget in skipped):
                break  # a passed-over request has been passed enough: it goes first
            if (too_big is None or reserve < too_big) and admits([*reserves, reserve]) == len(reserves) + 1:
                reserves.append(reserve)
                chosen.append(i)
                for passed_id, _ in skipped:
                    self._passed[passed_id] = self.passed(passed_id) + reserve
                continue
            too_big = reserve if too_big is None else min(too_big, reserve)
            if self.passed(seq_id) >= reserve:
                break  # passed enough already: nothing behind it goes first
            skipped.append((seq_id, reserve))
        left = {seq_id for seq_id, _ in waiting} - {waiting[i][0] for i in chosen}
        self._passed = {seq_id: n for seq_id, n in self._passed.items() if seq_id in left}
        return chosen
