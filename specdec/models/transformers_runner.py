"""TransformersRunner: any decoder-only causal LM that transformers implements, behind ModelRunner's API.

The fallback for a ``model_type`` the own runtime (:class:`~specdec.models.model_runner.ModelRunner`)
does not cover: the model is transformers' own modeling code (``AutoModelForCausalLM``), so its
outputs are transformers' by construction. Each slot holds one ``DynamicCache`` of full-attention
layers (sliding windows are applied by the model's masks, so a rollback never needs evicted
entries); ``truncate`` crops it, ``fork_slot`` copies it, and ``forward`` runs the rows one after
another. Exact but slower than the own runtime: no batching across slots and a cache that grows by
concatenation. Tensor parallelism is not offered for it.
"""

from __future__ import annotations

import copy
import heapq
import inspect
from typing import Any

import torch

from specdec.models.kv_cache import CacheFullError, InvalidSlotError
from specdec.models.model_runner import check_forward_request


class SlotCaches:
    """Per-slot transformers caches and their lengths; slot ids as the slot KV cache hands them out."""

    def __init__(self, num_slots: int) -> None:
        if num_slots < 1:
            raise ValueError(f"num_slots={num_slots} must be >= 1")
        self.num_slots = num_slots
        self.caches: dict[int, Any] = {}  # slot -> DynamicCache
        self.lengths: dict[int, int] = {}
        self._free_heap = list(range(num_slots))

    @property
    def num_free(self) -> int:
        return len(self._free_heap)

    def allocate(self, cache: Any) -> int:
        if not self._free_heap:
            raise CacheFullError(f"KV cache is full: all {self.num_slots} slots are allocated")
        slot = heapq.heappop(self._free_heap)
        self.caches[slot], self.lengths[slot] = cache, 0
        return slot

    def free(self, slot: int) -> None:
        self.length(slot)
        del self.caches[slot], self.lengths[slot]
        heapq.heappush(self._free_heap, slot)

    def length(self, slot: int) -> int:
        """Tokens cached in ``slot``; raises InvalidSlotError when it is not allocated."""
        if isinstance(slot, bool) or slot not in self.lengths:
            raise InvalidSlotError(f"slot {slot!r} is not allocated (num_slots={self.num_slots})")
        return self.lengths[slot]


class TransformersRunner:
    """ModelRunner's engine-facing API over a transformers causal LM (see the module docstring)."""

    runner_kind = "transformers"

    def __init__(self, model: Any, num_slots: int, max_seq_len: int) -> None:
        if getattr(model.config, "is_encoder_decoder", False):
            raise ValueError(f"model_type={model.config.model_type!r} is an encoder-decoder, not a causal LM")
        self.model = model.eval()
        text_config = model.config.get_text_config(decoder=True)
        self.max_position_embeddings = getattr(text_config, "max_position_embeddings", None) or max_seq_len
        if not 1 <= max_seq_len <= self.max_position_embeddings:
            raise ValueError(
                f"max_seq_len={max_seq_len} must be in [1, max_position_embeddings={self.max_position_embeddings}]"
            )
        self.max_seq_len = max_seq_len
        self.vocab_size = model.get_output_embeddings().weight.shape[0]
        self.cache = SlotCaches(num_slots)
        params = inspect.signature(model.forward).parameters
        self._cache_arg = "cache" if "cache" in params else "past_key_values"  # renamed in transformers 5.x

    @classmethod
    def from_pretrained(cls, name_or_path: str, num_slots: int = 8, max_seq_len: int = 1024,
                        dtype: str | torch.dtype = "float32", device: torch.device | str = "cpu") -> TransformersRunner:
        """Load with ``AutoModelForCausalLM.from_pretrained`` (a local directory or hub id) and wrap it."""
        from transformers import AutoModelForCausalLM

        from specdec.models.loader import resolve_dtype

        model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=resolve_dtype(dtype))
        return cls(model.to(device).requires_grad_(False), num_slots, max_seq_len)

    @property
    def num_free_slots(self) -> int:
        return self.cache.num_free

    def allocate_slot(self, reserve_tokens: int | None = None) -> int:
        """A slot whose cache grows as tokens arrive; ``reserve_tokens`` is not counted (no blocks:
        admission counts slots, each allowed up to max_seq_len)."""
        from transformers import DynamicCache

        return self.cache.allocate(DynamicCache())

    def admits(self, reserve_tokens: list[int | None]) -> int:
        """How many new sequences can start now: one per free slot, whatever their reserve."""
        return min(len(reserve_tokens), self.cache.num_free)

    block_capacity = (0, 0)  # not paged: admission counts slots

    def cached_tokens(self, slot: int) -> int:
        """Always 0: this runner has no prefix cache."""
        self.cache.length(slot)
        return 0

    def free_slot(self, slot: int) -> None:
        self.cache.free(slot)

    def slot_length(self, slot: int) -> int:
        return self.cache.length(slot)

    def truncate(self, slot: int, length: int) -> None:
        """Roll ``slot`` back to its first ``length`` tokens."""
        current = self.cache.length(slot)
        if not 0 <= length <= current:
            raise ValueError(f"truncate slot {slot}: new_length={length} must be in [0, {current}]")
        if length < current:
            self.cache.caches[slot].crop(length - current)  # a negative count removes that many tokens
            self.cache.lengths[slot] = length

    def fork_slot(self, slot: int, length: int) -> int:
        """A new slot holding the first ``length`` tokens of ``slot`` (raises CacheFullError)."""
        current = self.cache.length(slot)
        if not 0 <= length <= current:
            raise ValueError(f"fork_slot: length={length} must be in [0, {current}]")
        fork = self.cache.allocate(copy.deepcopy(self.cache.caches[slot]))
        self.cache.lengths[fork] = current
        self.truncate(fork, length)
        return fork

    @torch.inference_mode()
    def forward(self, slot_ids: list[int], token_ids: list[list[int]], last_only: bool = False) -> torch.Tensor:
        """Same contract as ModelRunner.forward: float32 logits [B, T, V] (T = longest row; entries past a row's
        length are zero) or, with ``last_only``, [B, V] at each row's last token. Rows run one at a time."""
        lengths = check_forward_request(slot_ids, token_ids, self.cache.length, self.vocab_size, self.max_seq_len)
        width = max(len(row) for row in token_ids)
        device = self.model.device
        shape = (len(slot_ids), self.vocab_size) if last_only else (len(slot_ids), width, self.vocab_size)
        out = torch.zeros(shape, dtype=torch.float32, device=device)  # [B, V] or [B, T, V]
        for b, (slot, row, start) in enumerate(zip(slot_ids, token_ids, lengths)):
            input_ids = torch.tensor([row], dtype=torch.long, device=device)  # [1, n]
            positions = torch.arange(start, start + len(row), device=device)[None]  # [1, n]
            kwargs = {self._cache_arg: self.cache.caches[slot], "use_cache": True, "position_ids": positions}
            logits = self.model(input_ids=input_ids, **kwargs).logits[0].float()  # [n, V]
            self.cache.lengths[slot] = start + len(row)
            if last_only:
                out[b] = logits[-1]
            else:
                out[b, : len(row)] = logits
        return out
