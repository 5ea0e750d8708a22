"""SyntheticLanguage: a cheap, seeded n-gram language model and a draft of controlled acceptance.

The target's next-token distribution depends only on the last `context_tokens` tokens
(hashed into one of `buckets` contexts, each with its own distribution over `support`
tokens, some peaked, some flat). The draft either knows the context (it predicts exactly
the target's distribution) or misses it: its guesses then lie on `support` other tokens
(the same shapes, `MISS_SHARPNESS` times sharper), so its top choice is wrong, and, as a real
draft's runner-up often is, the target's top token is its 2nd, 3rd, ... choice with the
shares `miss_ranks` gives (the rest of the misses rank it nowhere). Branches that guess the
target's token after a rejection (tree speculation, drafting ahead) hit as often as that.

Which contexts the draft knows is a hash of the context against the difficulty of the
stretch of text it lies in: stretches of `stretch_tokens` positions are easy (acceptance
α + d) or hard (α − d), half of each. A missed context accepts nothing greedily, but a
sampled draft token is accepted with the overlap Σ min(p, q) of the two distributions,
which the ranked target token brings to misses (β̄, computed from the tables at
temperature 1). So the draft knows a context with the chance k that puts α halfway between
greedy (k) and sampled (k + (1 − k)·β̄) acceptance: both lie within (1 − k)·β̄/2 of α, a
hundredth or two (the sharper wrong guesses keep β̄ small), at any temperature, top-k or
top-p, while acceptance varies from stretch to stretch as in real text.

Token 0 (the tokenizer's end-of-text) is never likely: sequences end at their budget or a
stop string; the emulated models make only readable tokens likely (`readable_ids`). Everything
a forward asks of it is table lookups and integer hashing over [batch, tokens] numpy arrays: on a
GPU this work is the device's, so here it must cost the host little, and a numpy operation on
arrays this small costs a fraction of a torch one's dispatch.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from specdec.models.emulated_profile import LanguageSpec

_PRIME = 2_147_483_647  # 2^31 - 1: hashes stay below it, so products fit int64
_FLOOR = -40.0  # logit of tokens outside a context's support (probability ~1e-18 of the top)
MISS_SHARPNESS = 2.0  # a missing draft's guesses are this much sharper than the target's contexts
KNOWN, FAR = 0, 1  # draft kinds: knows the context; misses it without ranking the target's token
# kind 2 + i: misses it, the target's top token its (i + 2)-th choice


def _mix(keys: np.ndarray, salt: int) -> np.ndarray:
    """Another well-spread int64 in [0, _PRIME) from each of `keys` (a Lehmer step with a salt)."""
    return ((keys * 48_271 + salt) % _PRIME * 16_807) % _PRIME


class SyntheticLanguage:
    """Logit tables of the target and of the draft's misses, and the context hashes that index them."""

    def __init__(self, spec: LanguageSpec, buckets: int = 2048, tokens: Sequence[int] | None = None) -> None:
        """tokens: the ids that may be likely (default: every id but 0)."""
        self.spec = spec
        self.vocab_size = spec.vocab_size
        self.buckets = buckets
        generator = torch.Generator().manual_seed(spec.seed)
        vocab, support = spec.vocab_size, spec.support
        candidates = torch.tensor(tokens if tokens is not None else range(1, vocab), dtype=torch.long)  # [C]
        if len(candidates) < 2 * support or int(candidates.min()) < 1 or int(candidates.max()) >= vocab:
            raise ValueError(f"need >= {2 * support} candidate tokens in [1, {vocab}), got {len(candidates)}")
        order = candidates[torch.rand(buckets, len(candidates), generator=generator).argsort(dim=1)]  # [K, C]
        sharpness = 1.0 + 3.0 * torch.rand(buckets, 1, generator=generator)  # [K, 1]: flat to peaked contexts
        scores = torch.randn(buckets, support, generator=generator) * sharpness  # [K, support]
        target = torch.full((buckets, vocab), _FLOOR).scatter_(1, order[:, :support], scores)  # [K, V]
        guesses = scores * MISS_SHARPNESS  # [K, support]: on tokens disjoint from the target's support
        far = torch.full((buckets, vocab), _FLOOR).scatter_(1, order[:, support:2 * support], guesses)  # [K, V]
        top = order[:, :support].gather(1, scores.argmax(dim=1, keepdim=True))  # [K, 1]: the target's argmax
        ranked = guesses.sort(dim=1, descending=True).values  # [K, support]
        misses = [far.clone().scatter_(1, top, self._just_above(ranked, rank)) for rank in
                  range(2, len(spec.miss_ranks) + 2)]  # each [K, V]: the target's argmax the rank-th choice
        self.tables = torch.cat([target, far, *misses])  # [(2 + R)·K, V]: kind j's row k at j·K + k
        self._miss_shares = np.cumsum(np.asarray(spec.miss_ranks, dtype=np.float64))  # [R]
        self.miss_overlap = self._miss_overlap(target, misses)
        spread = spec.acceptance_spread * min(spec.acceptance, 1.0 - spec.acceptance)
        self._known_easy, self._known_hard = (self.known_share(spec.acceptance + spread),
                                              self.known_share(spec.acceptance - spread))

    @staticmethod
    def _just_above(ranked: torch.Tensor, rank: int) -> torch.Tensor:
        """A logit [K, 1] ranking rank-th among the guesses `ranked` [K, support] (descending):
        a tenth of the way from the rank-th guess to the one above it."""
        below, above = ranked[:, rank - 1:rank], ranked[:, rank - 2:rank - 1]
        return below + 0.1 * (above - below)

    def _miss_overlap(self, target: torch.Tensor, misses: list[torch.Tensor]) -> float:
        """β̄: the mean Σ min(p, q) of a missed context at temperature 1 (the chance a sampled
        draft token is accepted there), over contexts and miss kinds (a far miss overlaps nothing)."""
        p = target.softmax(dim=-1)  # [K, V]
        shares = torch.tensor(self.spec.miss_ranks, dtype=torch.float64)  # [R]
        overlaps = [float(torch.minimum(p, miss.softmax(dim=-1)).sum(dim=-1).mean()) for miss in misses]
        return float((shares * torch.tensor(overlaps, dtype=torch.float64)).sum()) if overlaps else 0.0

    def known_share(self, acceptance: float) -> float:
        """k: how often the draft knows a context so that greedy (k) and sampled (k + (1 − k)·β̄)
        acceptance lie as far below and above `acceptance`."""
        half = self.miss_overlap / 2
        return min(1.0, max(0.0, (acceptance - half) / (1.0 - half)))

    def context_keys(self, history: np.ndarray) -> np.ndarray:
        """history [..., context_tokens] int64 (oldest first; vocab_size = before the text) -> keys [...]."""
        keys = np.full(history.shape[:-1], self.spec.seed % _PRIME + 1, dtype=np.int64)
        for j in range(history.shape[-1]):
            keys = (keys * 1_000_003 + history[..., j] + 1) % _PRIME
        return keys

    def buckets_of(self, keys: np.ndarray) -> np.ndarray:
        """Context keys [...] -> table rows [...]."""
        return _mix(keys, 1) % self.buckets

    def draft_kinds(self, keys: np.ndarray, anchors: np.ndarray, stretches: np.ndarray) -> np.ndarray:
        """What the draft makes of context `keys` [...] lying in stretch number `stretches` [...]
        that begins with token `anchors` [...]: KNOWN, FAR or 2 + i (the target's argmax its
        (i + 2)-th choice), int64 [...]."""
        stretch_keys = _mix(anchors * 1_000_003 + stretches + self.spec.seed % _PRIME, 2)
        easy = (stretch_keys % 1024) < 512  # [...]: half the stretches are easy
        chance = np.where(easy, self._known_easy, self._known_hard)  # [...]
        known_hash = _mix(keys, 3)  # [...]
        known = known_hash / _PRIME < chance
        rank_draw = _mix(known_hash, 4) / _PRIME  # [...]: a second draw, not the first one shifted
        rank = np.searchsorted(self._miss_shares, rank_draw, side="right")  # [...]: i, or R when unranked
        kinds = np.where(rank < len(self._miss_shares), rank + 2, FAR)
        return np.where(known, KNOWN, kinds)

    def draft_rows(self, buckets: np.ndarray, kinds: np.ndarray) -> np.ndarray:
        """The table rows [...] of the draft's logits for context rows `buckets` and kinds `kinds`."""
        return buckets + kinds * self.buckets

    def rows(self, rows: np.ndarray) -> torch.Tensor:
        """Rows [...] of the tables -> [..., V] (index_select: far cheaper than advanced indexing here)."""
        return self.tables.index_select(0, torch.from_numpy(rows.reshape(-1))).view(*rows.shape, self.vocab_size)
