"""Which rows of a ragged forward run together: a batch is right-padded to its longest row.

A forward over rows of different lengths costs about one row of the longest length per row
(`ModelRunner.forward` pads), so one newcomer's 64-token prompt in a catch-up of 1-token
rows makes every row 64 tokens long. Splitting the rows into a few forwards of similar
lengths avoids that, at the fixed cost of each extra forward. With the rows sorted by
length, the cheapest split is contiguous, and a small dynamic programme finds it:

    cost(group) = overhead_tokens + len(group) · longest(group)        (token-rows)

overhead_tokens is a forward's fixed cost expressed in padded token-rows: what one more
forward of a few decode rows costs, compared with making each row one token longer.
"""

from __future__ import annotations

FORWARD_OVERHEAD_TOKENS = 32  # a forward's fixed cost, in padded token-rows


def padding_groups(counts: list[int], overhead_tokens: int = FORWARD_OVERHEAD_TOKENS) -> list[list[int]]:
    """Row indices per forward, longest rows first; one group when splitting does not pay
    (ties keep one forward, so equal-length batches never split)."""
    if not counts or min(counts) < 1:
        raise ValueError(f"every row needs >= 1 token, got {counts}")
    if min(counts) == max(counts):  # nothing to pad (decode steps): one forward, without the O(n²) search
        return [list(range(len(counts)))]
    order = sorted(range(len(counts)), key=lambda i: -counts[i])
    n = len(order)
    best = [0.0] + [float("inf")] * n  # best[j]: cheapest split of the j longest rows
    cut = [0] * (n + 1)
    for j in range(1, n + 1):
        for i in range(j):  # the last group is rows i … j-1, padded to counts[order[i]]
            cost = best[i] + overhead_tokens + (j - i) * counts[order[i]]
            if cost < best[j] - 1e-9:
                best[j], cut[j] = cost, i
    groups, j = [], n
    while j > 0:
        groups.append(order[cut[j]:j])
        j = cut[j]
    return groups[::-1]
