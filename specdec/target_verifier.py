"""TargetVerifier: the in-process Verifier over a target ModelRunner and the rejection sampler."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdec.models.model_runner import ModelRunner
from specdec.rejection_sampler import rejection_sample
from specdec.sampling import SamplingBatch, normalize_probs, seeded_generator
from specdec.verifier import Verifier, VerifyRequest, VerifyResult

TARGET_SEED_OFFSET = 0  # the target's generator is seeded with the request seed itself


@dataclass
class _TargetState:
    slot: int
    generator: torch.Generator | None


class TargetVerifier(Verifier):
    """The target's slot cache holds each sequence's history minus its pending token.

    Sequences it has not seen (new ones, or all of them after a restart) are prefilled from
    the history they arrive with; a cache that is ahead of the history (a lost reply) is
    rolled back to it. So the caller's history is always the source of truth.
    """

    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner
        self.vocab_size = runner.vocab_size
        self.max_seq_len = runner.max_seq_len
        self._states: dict[str, _TargetState] = {}

    @property
    def num_free_slots(self) -> int:
        return self.runner.num_free_slots

    def active_sequences(self) -> list[str]:
        return list(self._states)

    def verify(self, requests: list[VerifyRequest]) -> list[VerifyResult]:
        if not requests:
            return []
        states = self._sync(requests)
        slots = [s.slot for s in states]
        old_lengths = [len(r.token_ids) - 1 for r in requests]
        logits = self.runner.forward(slots, [[r.token_ids[-1], *r.draft_token_ids] for r in requests])
        draft_ids, num_drafted, draft_probs = self._pack(requests, logits.shape[1] - 1)
        sampling = SamplingBatch.from_params([r.sampling for r in requests], [s.generator for s in states])
        out = rejection_sample(logits, draft_ids, num_drafted, draft_probs, sampling)
        results = []
        for i, (request, emitted) in enumerate(zip(requests, out.emitted())):
            num_accepted = int(out.num_accepted[i])
            self.runner.truncate(slots[i], old_lengths[i] + 1 + num_accepted)
            results.append(VerifyResult(request.seq_id, emitted, num_accepted))
        return results

    def _sync(self, requests: list[VerifyRequest]) -> list[_TargetState]:
        """Make every slot hold exactly history[:-1]: allocate, roll back, or prefill (batched)."""
        states, prefill_slots, prefill_chunks = [], [], []
        for request in requests:
            state = self._states.get(request.seq_id)
            if state is None:
                generator = seeded_generator(request.sampling.seed, TARGET_SEED_OFFSET)
                state = self._states[request.seq_id] = _TargetState(self.runner.allocate_slot(), generator)
            want, have = len(request.token_ids) - 1, self.runner.slot_length(state.slot)
            if have > want:
                self.runner.truncate(state.slot, want)
            elif have < want:
                prefill_slots.append(state.slot)
                prefill_chunks.append(request.token_ids[have:want])
            states.append(state)
        if prefill_slots:
            self.runner.forward(prefill_slots, prefill_chunks, last_only=True)
        return states

    def _pack(self, requests: list[VerifyRequest], width: int):
        """Drafted tokens [batch, width] (-1 padded), num_drafted [batch], q [batch, width, vocab] | None.

        When some rows carry draft probabilities, rows without them get a one-hot q (never a
        zero q, which would accept anything)."""
        draft_ids = torch.full((len(requests), width), -1, dtype=torch.long)
        num_drafted = torch.tensor([len(r.draft_token_ids) for r in requests], dtype=torch.long)
        for i, r in enumerate(requests):
            draft_ids[i, : len(r.draft_token_ids)] = torch.tensor(r.draft_token_ids, dtype=torch.long)
        if all(r.draft_probs is None for r in requests):
            return draft_ids, num_drafted, None
        draft_probs = torch.zeros(len(requests), width, self.vocab_size)
        for i, r in enumerate(requests):
            n = len(r.draft_token_ids)
            if r.draft_probs is None:
                draft_probs[i, torch.arange(n), draft_ids[i, :n]] = 1.0
                continue
            assert r.draft_probs.shape == (n, self.vocab_size), (
                f"draft_probs of {r.seq_id} must be [num_drafted, vocab], got {tuple(r.draft_probs.shape)}"
            )
            draft_probs[i, :n] = normalize_probs(r.draft_probs)
        return draft_ids, num_drafted, draft_probs

    def release(self, seq_id: str) -> None:
        state = self._states.pop(seq_id, None)
        if state is not None:
            self.runner.free_slot(state.slot)
