"""Rounds of verification for the rejection sampler's tests: one-hot targets, padded drafts, random
rounds, and the uniforms a row is addressed (specdec.sampling.rejection_sampler, counter_rng)."""

from __future__ import annotations

import torch

from specdec.sampling.counter_rng import uniforms
from specdec.sampling.rejection_sampler import PAD_TOKEN_ID
from specdec.sampling.sampling import SamplingBatch, logits_to_probs
from specdec.sampling.sampling_params import SamplingParams

VOCAB = 8
GREEDY = SamplingParams(temperature=0.0)
SAMPLED = SamplingParams(temperature=0.8)


def one_hot_logits(tokens: list[list[int]], vocab: int = VOCAB) -> torch.Tensor:
    """[B, T, V] logits whose processed distribution at each position is one-hot at the token."""
    ids = torch.tensor(tokens).unsqueeze(-1)  # [B, T, 1]
    return torch.full((*ids.shape[:2], vocab), float("-inf")).scatter_(-1, ids, 0.0)


def padded_drafts(drafts: list[list[int]], gamma: int, pad: int = PAD_TOKEN_ID) -> tuple[torch.Tensor, torch.Tensor]:
    """Ragged drafted tokens -> (draft_token_ids [B, gamma], num_drafted [B])."""
    ids = torch.full((len(drafts), gamma), pad, dtype=torch.long)
    for r, d in enumerate(drafts):
        ids[r, : len(d)] = torch.tensor(d, dtype=torch.long)
    return ids, torch.tensor([len(d) for d in drafts])


def random_round(batch: int, gamma: int, vocab: int, seed: int, params: list[SamplingParams]):
    """Random target logits, q and drafted tokens sampled from q (num_drafted = gamma)."""
    g = torch.Generator().manual_seed(seed)
    target_logits = torch.randn(batch, gamma + 1, vocab, generator=g)  # [B, gamma + 1, V]
    q = logits_to_probs(torch.randn(batch, gamma, vocab, generator=g), SamplingBatch.from_params(params))
    ids = torch.multinomial(q.reshape(-1, vocab), 1, generator=g).reshape(batch, gamma)  # [B, gamma]
    return target_logits, ids, torch.full((batch,), gamma), q


def addressed(batch: SamplingBatch, offsets: torch.Tensor, role: int) -> torch.Tensor:
    """Row b's uniforms at positions_b + offsets_b ([B] or [B, n]), straight from counter_rng."""
    positions = batch.positions.reshape((-1,) + (1,) * (offsets.dim() - 1)) + offsets
    return torch.from_numpy(uniforms(batch.seeds, positions.numpy(), role))
