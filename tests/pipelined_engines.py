"""Engines that draft ahead on the bundled pair, for the drafting-ahead tests: an in-process
verifier that says it runs concurrently, and the target's own logits to test against."""

from __future__ import annotations

import numpy as np
import torch

from specdec.round.draft_ahead import DraftAhead
from specdec.round.look_ahead_depth import LookAheadDepth
from specdec.round.look_ahead_hits import LookAheadHits
from specdec.round.engine import SpeculativeEngine
from specdec.models.model_paths import resolve_model_path
from specdec.models.model_runner import ModelRunner
from specdec.proposers.draft_proposer import DraftModelProposer
from specdec.round.overlap_choice import MICRO_BATCHES
from specdec.verifiers.target_verifier import TargetVerifier
from specdec.verifiers.verifier import Verifier


class ConcurrentVerifier(Verifier):
    """An in-process verifier that says it runs concurrently, so the engine drafts ahead
    (here the draft simply runs after the verify call: same logic, no parallelism)."""

    runs_concurrently = True

    def __init__(self, inner: TargetVerifier) -> None:
        self.inner, self.vocab_size, self.max_seq_len = inner, inner.vocab_size, inner.max_seq_len

    @property
    def num_free_slots(self) -> int:
        return self.inner.num_free_slots

    def verify(self, requests):
        return self.inner.verify(requests)

    def release(self, seq_id):
        self.inner.release(seq_id)


def pipelined(num_slots: int = 8, max_seq_len: int = 256, min_acceptance: float = 0.0, gamma: int = 4,
              way: str | None = MICRO_BATCHES, branches: int | None = 3, draft_slots: int | None = None,
              hits: LookAheadHits | None = None, block_rounds: int = 24, explore_every: int = 6,
              depth: LookAheadDepth | None = None):
    """way: every step's (None: measured); draft_slots: the draft's cache (default num_slots
    + 16, room for the look-ahead's forks); depth: default the whole γ (here the verify ends
    before the look-ahead starts, so a measured depth would shrink to one draft)."""
    target = ModelRunner.from_pretrained(resolve_model_path("bundled:target"), num_slots=num_slots,
                                         max_seq_len=max_seq_len)
    draft = ModelRunner.from_pretrained(resolve_model_path("bundled:draft"), num_slots=draft_slots or num_slots + 16,
                                        max_seq_len=max_seq_len)
    proposer = DraftModelProposer(draft, target.vocab_size, wire_dtype=torch.float16)
    return SpeculativeEngine(ConcurrentVerifier(TargetVerifier(target)), proposer, gamma=gamma,
                             draft_ahead=DraftAhead(min_acceptance, way, branches, hits, block_rounds, explore_every,
                                                    depth or LookAheadDepth(most_cut=0)))


def target_logits(histories: list[list[int]]) -> np.ndarray:
    """The target's next-token logits after each history, [n, V] float64."""
    runner = ModelRunner.from_pretrained(resolve_model_path("bundled:target"), num_slots=len(histories), max_seq_len=8)
    slots = [runner.allocate_slot() for _ in histories]
    return runner.forward(slots, histories, last_only=True).double().numpy()
