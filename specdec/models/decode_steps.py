"""DecodeSteps: a proposal's single-token forwards over fixed slots, their inputs built once.

A draft guesses γ tokens per row with γ - 1 one-token forwards after its catch-up. A plain
`ModelRunner.forward` per step checks the rows, makes their next position writable and
builds input tensors each time; that host work is on the round's critical path on any
device (a GPU server's host builds the same inputs). Here the rows are checked and every
step's positions made writable once per proposal (`KVCache.prepare_rows` over all the
steps), and the inputs live in a runner's persistent buffer (`StepInputs`), filled in place
each step, as a CUDA-graph runner's static inputs are. Each step returns what
``forward(..., last_only=True)`` would.

`decode_steps` gives a runner's own DecodeSteps, or per-step forwards for a runner without
them (the transformers fallback, a mirrored tensor-parallel group).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from specdec.models.model_runner import ModelRunner


class StepInputs:
    """A runner's decode inputs: token, position and slot of up to ``rows`` rows, in one host
    buffer written through NumPy (no tensor made per step) and, off the CPU, one device copy;
    the tensors a batch of B rows reads are views made once per B."""

    def __init__(self, rows: int, device: torch.device) -> None:
        self.host = torch.zeros(3, rows, dtype=torch.long)  # [3, rows]: token, position, slot
        self.host_view = self.host.numpy()
        self._device = self.host if device.type == "cpu" else torch.zeros_like(self.host, device=device)
        self._views: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}

    def inputs(self, batch: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """input_ids [batch, 1], positions [batch, 1], slots [batch] of the buffer's first rows
        (on the device, after host_view's rows were written)."""
        if self._device is not self.host:
            self._device[:, :batch].copy_(self.host[:, :batch])
        views = self._views.get(batch)
        if views is None:
            input_ids, positions, slots = self._device[:, :batch, None].unbind()
            views = self._views[batch] = (input_ids, positions, slots[:, 0])
        return views


class DecodeSteps:
    """Row b (slot ``slot_ids[b]``) feeds one token per `forward` it takes part in, at most
    ``counts[b]`` in all. One at a time per runner (its forwards are)."""

    def __init__(self, runner: ModelRunner, inputs: StepInputs, slot_ids: list[int], counts: list[int]) -> None:
        cache = runner.cache
        if len(slot_ids) != len(counts) or len(set(slot_ids)) != len(slot_ids) or min(counts, default=0) < 0:
            raise ValueError(f"decode steps need distinct slots, one count >= 0 each: {slot_ids}, {counts}")
        starts = cache.lengths(slot_ids)  # InvalidSlotError for a slot not allocated
        for slot, start, count in zip(slot_ids, starts, counts):
            if start + count > runner.max_seq_len:
                raise ValueError(f"slot {slot}: length {start} + {count} steps exceeds "
                                 f"max_seq_len={runner.max_seq_len}")
        stepping = [b for b, count in enumerate(counts) if count]
        cache.prepare_rows([slot_ids[b] for b in stepping], [counts[b] for b in stepping])  # every step's blocks
        self._runner, self._inputs, self._slots = runner, inputs, slot_ids
        self._next, self._ends = starts, [start + count for start, count in zip(starts, counts)]  # positions
        self._mode = torch.inference_mode()

    def forward(self, tokens: list[int], rows: list[int] | None = None) -> torch.Tensor:
        """Feed ``tokens[k]`` to row ``rows[k]`` (ascending; default every row); -> float32 logits
        [len(tokens), vocab] at the fed positions. ValueError (nothing changed) for a token
        outside the vocabulary or a row past its count."""
        runner, batch = self._runner, len(tokens)
        rows = range(len(self._slots)) if rows is None else rows
        positions = [self._next[b] for b in rows]
        if min(tokens) < 0 or max(tokens) >= runner.vocab_size:
            raise ValueError(f"decode step tokens {tokens} outside [0, vocab_size={runner.vocab_size})")
        if len(rows) != batch or any(p >= self._ends[b] for p, b in zip(positions, rows)):
            raise ValueError(f"decode step for rows {list(rows)} with {batch} tokens: a row past its count")
        slots = [self._slots[b] for b in rows]
        host = self._inputs.host_view  # [3, rows]
        host[0, :batch], host[1, :batch], host[2, :batch] = tokens, positions, slots
        input_ids, position_ids, slot_ids = self._inputs.inputs(batch)
        with self._mode:
            hidden = runner.model.forward_hidden(input_ids, position_ids, runner.cache, slot_ids, None,
                                                 [p + 1 for p in positions])  # each row reads up to its new token
            logits = runner.model.compute_logits(hidden.view(batch, -1)).float()  # [batch, vocab]
        for b in rows:
            self._next[b] += 1
        runner.cache.advance_rows(slots, [[token] for token in tokens])
        return logits


class ForwardSteps:
    """DecodeSteps' contract over a runner's plain `forward` (one per step)."""

    def __init__(self, runner, slot_ids: list[int]) -> None:
        self._runner, self._slots = runner, slot_ids

    def forward(self, tokens: list[int], rows: list[int] | None = None) -> torch.Tensor:
        slots = self._slots if rows is None else [self._slots[b] for b in rows]
        return self._runner.forward(slots, [[token] for token in tokens], last_only=True)  # [a, vocab]


def decode_steps(runner, slot_ids: list[int], counts: list[int]) -> DecodeSteps | ForwardSteps:
    """The runner's DecodeSteps for these rows, or per-step forwards where it has none."""
    make = getattr(runner, "decode_steps", None)
    return make(slot_ids, counts) if make is not None else ForwardSteps(runner, slot_ids)
