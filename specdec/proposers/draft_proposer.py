"""Draft-model proposer: a small model with its own slot cache guesses γ tokens.

The proposer is history-driven: per sequence it remembers which tokens its cache holds.
Each round it rolls the cache back (O(1)) to the longest prefix the new history confirms —
the accepted drafted tokens survive, the rejected ones are forgotten — feeds the tokens it
has not seen (usually the recovered/bonus token; many after speculation was off or after a
restart) and then drafts γ tokens, feeding γ - 1 of them back. There is no separate
"commit" step, so a proposer that missed rounds simply catches up.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from specdec.models.model_runner import ModelRunner
from specdec.proposers.base import Proposal, ProposalRequest, Proposer
from specdec.sampling import SamplingBatch, logits_to_probs, normalize_probs, sample_from_probs, seeded_generator

DRAFT_SEED_OFFSET = 0x9E3779B9  # the draft's stream differs from the target's for the same seed


@dataclass
class _DraftState:
    slot: int
    generator: torch.Generator | None
    cached: list[int] = field(default_factory=list)  # tokens held by the slot, in order
    confirmed: int = 0  # history[:confirmed] matched `cached` at the last round (histories only grow)


def common_prefix_length(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class DraftModelProposer(Proposer):
    """Proposes by running the draft model autoregressively, batched over sequences."""

    has_probs = True

    def __init__(self, runner: ModelRunner, vocab_size: int, wire_dtype: torch.dtype | None = None) -> None:
        """vocab_size: the target's vocabulary rows; q is cut or padded to it (padding rows
        that differ between two models carry no probability).
        wire_dtype: when q travels compactly (float16 over gRPC), round it to that dtype
        *before* sampling, so the token is drawn from exactly the q the target will see."""
        self.runner = runner
        self.vocab_size = vocab_size
        self.wire_dtype = wire_dtype
        self._states: dict[str, _DraftState] = {}

    def _state(self, request: ProposalRequest) -> _DraftState:
        state = self._states.get(request.seq_id)
        if state is None:
            generator = seeded_generator(request.sampling.seed, DRAFT_SEED_OFFSET)
            state = self._states[request.seq_id] = _DraftState(self.runner.allocate_slot(), generator)
        return state

    def _fit_vocab(self, logits: torch.Tensor) -> torch.Tensor:
        # [batch, draft_vocab] -> [batch, vocab_size]
        extra = self.vocab_size - logits.shape[-1]
        if extra <= 0:
            return logits[:, : self.vocab_size]
        return torch.nn.functional.pad(logits, (0, extra), value=float("-inf"))

    def _catch_up(self, requests: list[ProposalRequest], states: list[_DraftState], gamma: int) -> torch.Tensor:
        """Roll each cache back to what the history confirms and feed the rest of the history.
        Returns next-token logits [batch, vocab]."""
        chunks = []
        for request, state in zip(requests, states):
            history = request.token_ids
            if len(history) + gamma - 1 > self.runner.max_seq_len:
                raise ValueError(
                    f"sequence {request.seq_id}: {len(history)} tokens + gamma {gamma} "
                    f"exceed the draft's max_seq_len {self.runner.max_seq_len}"
                )
            start = min(state.confirmed, len(state.cached))
            # the pending token (history[-1]) is always fed, so it is never kept
            keep = start + common_prefix_length(state.cached[start:], history[start:-1])
            state.confirmed = len(history)
            self.runner.truncate(state.slot, keep)
            del state.cached[keep:]
            chunks.append(history[keep:])
            state.cached.extend(history[keep:])
        logits = self.runner.forward([s.slot for s in states], chunks, last_only=True)
        return self._fit_vocab(logits)

    def propose(self, requests: list[ProposalRequest], gamma: int) -> Proposal:
        if gamma == 0 or not requests:
            return Proposal.empty(len(requests), gamma)
        states = [self._state(r) for r in requests]
        batch = SamplingBatch.from_params([r.sampling for r in requests], [s.generator for s in states])
        logits = self._catch_up(requests, states, gamma)  # [batch, vocab]
        tokens, probs = [], []
        for i in range(gamma):
            if batch.all_greedy:
                token = logits.argmax(dim=-1)  # [batch]
            else:
                weights = logits_to_probs(logits, batch)  # [batch, vocab]
                if self.wire_dtype is not None:
                    weights = weights.to(self.wire_dtype).float()
                token = sample_from_probs(normalize_probs(weights), batch.generators, greedy=batch.greedy)
                probs.append(weights)
            tokens.append(token)
            if i < gamma - 1:
                fed = [[t] for t in token.tolist()]
                logits = self._fit_vocab(self.runner.forward([s.slot for s in states], fed, last_only=True))
                for state, t in zip(states, fed):
                    state.cached.extend(t)
        return Proposal(
            token_ids=torch.stack(tokens, dim=1),  # [batch, gamma]
            num_drafted=torch.full((len(requests),), gamma, dtype=torch.long),
            # q as weights (normalize_probs gives the distribution); [batch, gamma, vocab]
            probs=torch.stack(probs, dim=1) if probs else None,
        )

    def release(self, seq_id: str) -> None:
        state = self._states.pop(seq_id, None)
        if state is not None:
            self.runner.free_slot(state.slot)
