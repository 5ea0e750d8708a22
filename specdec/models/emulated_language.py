"""SyntheticLanguage: a cheap, seeded n-gram language model and a draft of controlled acceptance.

The target's next-token distribution depends only on the last `context_tokens` tokens
(hashed into one of `buckets` contexts, each with its own distribution over `support`
tokens, some peaked, some flat). The draft either knows the context (it predicts exactly
the target's distribution) or guesses elsewhere (the same shape over `support` other
tokens, so the target accepts none of it). Which contexts the draft knows is a hash of the
context against the difficulty of the stretch of text it lies in: stretches of
`stretch_tokens` positions are easy (known with probability α + d) or hard (α − d), half
of each, so the per-token acceptance is α on average for greedy and sampled decoding at
any temperature, top-k or top-p, while it varies from stretch to stretch as in real text.

Token 0 (the tokenizer's end-of-text) is never likely: sequences end at their budget or a
stop string; the emulated models make only readable tokens likely (`readable_ids`). Everything is table lookups
and integer hashing over [batch, tokens] tensors.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specdec.models.emulated_profile import LanguageSpec

_PRIME = 2_147_483_647  # 2^31 - 1: hashes stay below it, so products fit int64
_FLOOR = -40.0  # logit of tokens outside a context's support (probability ~1e-18 of the top)


def _mix(keys: torch.Tensor, salt: int) -> torch.Tensor:
    """Another well-spread int64 in [0, _PRIME) from each of `keys` (a Lehmer step with a salt)."""
    return ((keys * 48_271 + salt) % _PRIME * 16_807) % _PRIME


class SyntheticLanguage:
    """Logit tables of the target and of the draft's guesses, and the context hashes that index them."""

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
        guess = torch.full((buckets, vocab), _FLOOR).scatter_(
            1, order[:, support:2 * support], scores)  # [K, V]: disjoint from the target's support
        self.tables = torch.cat([target, guess])  # [2K, V]: row k the target's, row K + k the draft's guess
        spread = spec.acceptance_spread * min(spec.acceptance, 1.0 - spec.acceptance)
        self._known_easy, self._known_hard = spec.acceptance + spread, spec.acceptance - spread

    def context_keys(self, history: torch.Tensor) -> torch.Tensor:
        """history [..., context_tokens] int64 (oldest first; vocab_size = before the text) -> keys [...]."""
        keys = torch.full(history.shape[:-1], self.spec.seed % _PRIME + 1, dtype=torch.long)
        for j in range(history.shape[-1]):
            keys = (keys * 1_000_003 + history[..., j] + 1) % _PRIME
        return keys

    def buckets_of(self, keys: torch.Tensor) -> torch.Tensor:
        """Context keys [...] -> table rows [...]."""
        return _mix(keys, 1) % self.buckets

    def draft_knows(self, keys: torch.Tensor, anchors: torch.Tensor, stretches: torch.Tensor) -> torch.Tensor:
        """Whether the draft predicts the target's distribution [...] bool, for context `keys`
        lying in stretch number `stretches` [...] that begins with token `anchors` [...]."""
        stretch_keys = _mix(anchors * 1_000_003 + stretches + self.spec.seed % _PRIME, 2)
        easy = (stretch_keys % 1024) < 512  # [...]: half the stretches are easy
        chance = torch.where(easy, self._known_easy, self._known_hard)  # [...]
        return (_mix(keys, 3).double() / _PRIME) < chance

    def target(self, buckets: torch.Tensor) -> torch.Tensor:
        """Table rows [...] -> the target's logits [..., V]."""
        return self._rows(buckets)

    def draft(self, buckets: torch.Tensor, known: torch.Tensor) -> torch.Tensor:
        """Table rows [...] and whether the draft knows each context [...] -> the draft's logits [..., V]."""
        return self._rows(torch.where(known, buckets, buckets + self.buckets))

    def _rows(self, rows: torch.Tensor) -> torch.Tensor:
        """Rows [...] of the tables -> [..., V] (index_select: far cheaper than advanced indexing here)."""
        return self.tables.index_select(0, rows.flatten()).view(*rows.shape, self.vocab_size)
