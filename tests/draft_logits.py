"""The draft model's own logits, for tests that check what a proposer drew from."""

from __future__ import annotations

import torch


def raw_logits(runner, tokens: list[int]) -> torch.Tensor:
    """The model's logits after every token of `tokens` ([T, V] float64), on a fresh slot."""
    slot = runner.allocate_slot()
    try:
        return runner.forward([slot], [tokens])[0].double()
    finally:
        runner.free_slot(slot)
