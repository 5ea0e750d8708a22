"""ModelRunner: the engine-facing API over a serving model and its paged KV cache.

Sequences are identified by cache slots (sequence ids; their K/V live in blocks,
`KVCache`). ``forward`` appends tokens to several slots in
one batched call (ragged lengths are right-padded internally, very different ones split
into a few forwards) and returns logits;
``truncate`` rolls a slot back in O(1) after draft tokens are rejected.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from specdec.models.decode_steps import DecodeSteps, StepInputs
from specdec.models.kv_cache import DEFAULT_BLOCK_SIZE, KVCache
from specdec.models.llama import LlamaForServing
from specdec.models.loader import load_model
from specdec.models.padding_groups import padding_groups
from specdec.models.pool_sizing import size_pool


class ModelRunner:
    """Owns a model and a KVCache sized from it (local K/V heads, so TP-sharded models work too)."""

    runner_kind = "specdec"  # the own runtime (the fallback on transformers' code is "transformers")

    def __init__(self, model: LlamaForServing, num_slots: int, max_seq_len: int | None,
                 block_size: int = DEFAULT_BLOCK_SIZE, num_blocks: int | None = None,
                 memory_budget: float | None = None, prefix_caching: bool = True,
                 kv_tokens: int | None = None) -> None:
        """``num_slots``: most sequences (and forks) at once. The block pool: ``num_blocks``, else what
        ``memory_budget`` (bytes, or a fraction of device memory) or else ``kv_tokens`` holds, at most
        ``num_slots`` sequences of ``max_seq_len``; by default exactly that (the memory of a slot cache).
        ``max_seq_len`` None: the model's context, at most what the pool holds (`size_pool`).
        ``prefix_caching``: reuse the full blocks of earlier sequences' tokens (`KVCache.attach_prefix`)."""
        self.model = model
        self.max_position_embeddings = model.config.max_position_embeddings
        layers, heads, head_dim = model.config.num_hidden_layers, model.num_local_kv_heads, model.config.head_dim
        if num_blocks is None:
            block_bytes = KVCache.block_bytes(layers, block_size, heads, head_dim, model.dtype)
            max_seq_len, num_blocks = size_pool(self.max_position_embeddings, num_slots, max_seq_len, block_size,
                                                block_bytes, model.device, memory_budget, kv_tokens)
        max_seq_len = self.max_position_embeddings if max_seq_len is None else max_seq_len
        if not 1 <= max_seq_len <= self.max_position_embeddings:
            raise ValueError(
                f"max_seq_len={max_seq_len} must be in [1, max_position_embeddings="
                f"{self.max_position_embeddings}]"
            )
        self.max_seq_len = max_seq_len
        self.vocab_size = model.vocab_size
        self.cache = KVCache(
            num_layers=layers,
            num_slots=num_slots,
            max_seq_len=max_seq_len,
            num_kv_heads=heads,
            head_dim=head_dim,
            dtype=model.dtype,
            device=model.device,
            block_size=block_size,
            num_blocks=num_blocks,
            prefix_caching=prefix_caching,
        )
        self._step_inputs = StepInputs(num_slots, model.device)  # the decode steps' persistent inputs
        self._inference = torch.inference_mode()  # entered by each forward (one object: no context made per call)

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str,
        num_slots: int = 8,
        max_seq_len: int = 1024,
        dtype: str | torch.dtype = "float32",
        device: torch.device | str = "cpu",
        time_scale: float = 1.0,
        block_size: int = DEFAULT_BLOCK_SIZE,
        num_blocks: int | None = None,
        memory_budget: float | None = None,
        prefix_caching: bool = True,
        kv_tokens: int | None = None,
    ) -> ModelRunner:
        """Load a HF-format checkpoint (local directory or hub id), or an emulated model, and wrap it."""
        return cls(load_model(name_or_path, dtype=dtype, device=device, time_scale=time_scale),
                   num_slots, max_seq_len, block_size, num_blocks, memory_budget, prefix_caching, kv_tokens)

    @property
    def num_free_slots(self) -> int:
        """Slots that can still be allocated."""
        return self.cache.num_free

    def allocate_slot(self, reserve_tokens: int | None = None) -> int:
        """Reserve an empty slot that may grow to ``reserve_tokens`` (None or 0: max_seq_len) tokens
        (raises CacheFullError when no slot or not enough blocks are free)."""
        return self.cache.allocate(reserve_tokens)

    def admits(self, reserve_tokens: list[int | None]) -> int:
        """How many of these new sequences (their reserves, in order) `allocate_slot` would take now."""
        return self.cache.admits(reserve_tokens)

    def grow_reserves(self, reserves: list[tuple[int, int]], taken: list[int | None] = ()) -> int:
        """Raise these slots' reserves ((slot, tokens), in order) while the free blocks cover them,
        after ``taken`` reserves of sequences not allocated yet; how many were raised (`KVCache.grow`)."""
        return self.cache.grow(reserves, taken)

    @property
    def cache_usage(self) -> float:
        """Share of the cache's blocks taken or reserved by live sequences (0 idle, 1 full)."""
        return self.cache.usage

    @property
    def block_capacity(self) -> tuple[int, int]:
        """(blocks, tokens per block) of the paged cache: what admission counts."""
        return self.cache.num_blocks, self.cache.block_size

    def free_slot(self, slot: int) -> None:
        """Release ``slot`` (raises InvalidSlotError if it is not allocated)."""
        self.cache.free(slot)

    def slot_length(self, slot: int) -> int:
        """Number of tokens cached in ``slot``."""
        return self.cache.length(slot)

    def cached_tokens(self, slot: int) -> int:
        """Tokens of ``slot`` that came from the prefix cache instead of a forward."""
        return self.cache.cached_tokens(slot)

    def truncate(self, slot: int, length: int) -> None:
        """Roll ``slot`` back to its first ``length`` tokens (O(1))."""
        self.cache.truncate(slot, length)

    def fork_slot(self, slot: int, length: int) -> int:
        """A new slot holding the first ``length`` tokens of ``slot``, sharing its blocks copy-on-write
        (raises CacheFullError). It may grow to what ``slot`` may (its reserve)."""
        fork = self.cache.allocate(self.cache.reserve_tokens(slot))
        try:
            self.cache.fork(slot, fork, length)
        except BaseException:
            self.cache.free(fork)
            raise
        return fork

    def forward(self, slot_ids: list[int], token_ids: list[list[int]], last_only: bool = False) -> torch.Tensor:
        """Append ``token_ids[b]`` (lengths may differ, each >= 1) to slot ``slot_ids[b]``; return float32 logits.

        Returns [B, T, V] with T = max row length (entries past a row's length are undefined) or,
        with ``last_only``, [B, V] at each row's last token (lm_head runs only there). Each slot's
        length grows by exactly ``len(token_ids[b])``. Rows of very different lengths (a prompt
        among decode rows) run as a few forwards of similar lengths (`padding_groups`): each
        row attends only to its own slot, so the split changes the cost, not the result. With
        ``last_only``, leading full blocks the prefix cache holds are attached, not recomputed.
        """
        lengths = check_forward_request(slot_ids, token_ids, self.cache.lengths, self.vocab_size, self.max_seq_len)
        if last_only and max(len(row) for row in token_ids) > self.cache.block_size:  # else no block to attach
            token_ids, lengths = self._attach_cached_prefixes(slot_ids, token_ids, lengths)
        groups = padding_groups([len(row) for row in token_ids])
        with self._inference:
            if len(groups) == 1:
                return self._forward_padded(slot_ids, token_ids, lengths, last_only)
            return self._forward_groups(slot_ids, token_ids, lengths, last_only, groups)

    def _forward_groups(self, slot_ids: list[int], token_ids: list[list[int]], lengths: list[int], last_only: bool,
                        groups: list[list[int]]) -> torch.Tensor:
        """`forward` as one forward per group of rows (`padding_groups`), their logits in row order."""
        width = max(len(row) for row in token_ids)
        shape = (len(slot_ids), self.vocab_size) if last_only else (len(slot_ids), width, self.vocab_size)
        out = torch.zeros(shape, dtype=torch.float32, device=self.model.device)  # [B, V] or [B, T, V]
        for rows in groups:
            logits = self._forward_padded([slot_ids[i] for i in rows], [token_ids[i] for i in rows],
                                          [lengths[i] for i in rows], last_only)  # [g, V] or [g, T_g, V]
            index = torch.tensor(rows, dtype=torch.long, device=out.device)
            if last_only:
                out[index] = logits
            else:
                out[index, : logits.shape[1]] = logits
        return out

    def decode_steps(self, slot_ids: list[int], counts: list[int]) -> DecodeSteps:
        """One-token forwards of these slots, ``counts[b]`` at most for row b, their checks, blocks
        and input tensors done once (`DecodeSteps`); each step returns what ``forward`` would."""
        return DecodeSteps(self, self._step_inputs, slot_ids, counts)

    def _attach_cached_prefixes(self, slot_ids: list[int], token_ids: list[list[int]],
                                lengths: list[int]) -> tuple[list[list[int]], list[int]]:
        """Each row less the tokens whose K/V the prefix cache already had (at least one is left to
        compute), and its slot's length after attaching them."""
        rows, starts = [], []
        for slot, row, start in zip(slot_ids, token_ids, lengths):
            attached = self.cache.attach_prefix(slot, row)
            rows.append(row[attached:])
            starts.append(start + attached)
        return rows, starts

    def _forward_padded(self, slot_ids: list[int], token_ids: list[list[int]], lengths: list[int],
                        last_only: bool) -> torch.Tensor:
        """One forward, every row right-padded to the longest (`forward`, already validated)."""
        counts = [len(row) for row in token_ids]
        width = max(counts)
        device = self.model.device
        if width == 1:  # decode steps: tokens, positions and slots as one tensor (host time per tensor made)
            input_ids, positions, slots = torch.tensor([[row[0] for row in token_ids], lengths, slot_ids],
                                                       dtype=torch.long, device=device).unbind()  # each [B]
            input_ids, positions = input_ids.view(-1, 1), positions.view(-1, 1)  # [B, 1]
        else:
            padded = [row + [0] * (width - len(row)) for row in token_ids] if min(counts) < width else token_ids
            input_ids = torch.tensor(padded, dtype=torch.long, device=device)  # [B, T]
            positions = _positions(lengths, width, device)  # [B, T]
            slots = torch.tensor(slot_ids, dtype=torch.long, device=device)  # [B]
        num_tokens = torch.tensor(counts, dtype=torch.long, device=device) if min(counts) < width else None
        kv_len = [start + n for start, n in zip(lengths, counts)]  # each row's: rows read the cache by context
        self.cache.prepare_rows(slot_ids, counts)  # blocks for the new positions; copies shared ones (copy-on-write)
        hidden = self.model.forward_hidden(input_ids, positions, self.cache, slots, num_tokens, kv_len)
        if last_only and num_tokens is None:  # rows of equal length (decode steps): the last column
            hidden = hidden.reshape(len(counts), -1) if width == 1 else hidden[:, -1].contiguous()  # [B, hidden]
        elif last_only:
            hidden = hidden[torch.arange(len(counts), device=device), num_tokens - 1]  # [B, hidden]
        logits = self.model.compute_logits(hidden).float()
        self.cache.advance_rows(slot_ids, token_ids)  # full blocks join the prefix cache
        return logits


def _positions(starts: list[int], width: int, device: torch.device) -> torch.Tensor:
    """[B, width] int64: row b's positions starts[b] … starts[b] + width - 1. Small batches
    (decode steps, verifies) are listed in Python: one tensor made, not three."""
    if len(starts) * width <= 256:
        return torch.tensor([list(range(start, start + width)) for start in starts], dtype=torch.long, device=device)
    return torch.tensor(starts, dtype=torch.long, device=device)[:, None] + torch.arange(width, device=device)


def check_forward_request(slot_ids: list[int], token_ids: list[list[int]],
                          lengths_of: Callable[[list[int]], list[int]], vocab_size: int, max_seq_len: int) -> list[int]:
    """Check a forward's rows (one distinct allocated slot each, >= 1 in-vocabulary token, room left in the
    slot) and return each slot's current length; ``lengths_of`` (the slots' lengths) raises
    InvalidSlotError for unallocated slots. The checks run over the whole batch at once; a row is
    looked for only to name it in the error."""
    if len(slot_ids) != len(token_ids) or not slot_ids:
        raise ValueError(
            f"slot_ids ({len(slot_ids)}) and token_ids ({len(token_ids)}) must be non-empty and equal in length"
        )
    if len(set(slot_ids)) != len(slot_ids):
        raise ValueError(f"duplicated slot ids in one forward: slot_ids={slot_ids}")
    lengths = lengths_of(slot_ids)
    if not all(token_ids):
        slot = next(slot for slot, row in zip(slot_ids, token_ids) if not row)
        raise ValueError(f"token_ids for slot {slot} is empty; each row needs >= 1 token")
    if min(map(min, token_ids)) < 0 or max(map(max, token_ids)) >= vocab_size:
        slot = next(slot for slot, row in zip(slot_ids, token_ids) if min(row) < 0 or max(row) >= vocab_size)
        raise ValueError(f"token_ids for slot {slot} has ids outside [0, vocab_size={vocab_size})")
    if max(map(len, token_ids)) + max(lengths) > max_seq_len:
        for slot, row, length in zip(slot_ids, token_ids, lengths):
            if length + len(row) > max_seq_len:
                raise ValueError(
                    f"slot {slot}: length {length} + {len(row)} new tokens exceeds max_seq_len={max_seq_len}"
                )
    return lengths
