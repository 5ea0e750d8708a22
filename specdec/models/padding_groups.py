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

import functools

FORWARD_OVERHEAD_TOKENS = 32  # a forward's fixed cost, in padded token-rows


def padding_groups(counts: list[int], overhead_tokens: int = FORWARD_OVERHEAD_TOKENS) -> list[list[int]]:
    """Row indices per forward, longest rows first; one group when splitting does not pay
    (ties keep one forward, so equal-length batches never split)."""
    if not counts or min(counts) < 1:
        raise ValueError(f"every row needs >= 1 token, got {counts}")
    if min(counts) == max(counts):  # nothing to pad (decode steps): one forward, without the O(n²) search
        return [list(range(len(counts)))]
    order = sorted(range(len(counts)), key=lambda i: -counts[i])
    cuts = _cuts(tuple(counts[i] for i in order), overhead_tokens)
    return [order[start:end] for start, end in zip(cuts, cuts[1:])]


@functools.lru_cache(maxsize=4096)
def _cuts(lengths: tuple[int, ...], overhead_tokens: float) -> tuple[int, ...]:
    """Where the cheapest split of rows sorted longest first (their ``lengths``) cuts, 0 and
    len(lengths) included. A function of the sorted lengths alone, so kept: a catch-up's rows
    (1 or 2 tokens each) repeat the same few patterns round after round, and the search is O(n²)."""
    n = len(lengths)
    best = [0.0] + [float("inf")] * n  # best[j]: cheapest split of the j longest rows
    cut = [0] * (n + 1)
    for j in range(1, n + 1):
        for i in range(j):  # the last group is rows i … j-1, padded to lengths[i]
            cost = best[i] + overhead_tokens + (j - i) * lengths[i]
            if cost < best[j] - 1e-9:
                best[j], cut[j] = cost, i
    cuts, j = [n], n
    while j > 0:
        j = cut[j]
        cuts.append(j)
    return tuple(cuts[::-1])
