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
from specdec.models.pool_sizing import blocks_in_budget
from specdec.models.model_runner import check_forward_request


class SlotCaches:
    """Per-slot transformers caches and their lengths; slot ids as the slot KV cache hands them out.
    With ``budget_tokens`` a slot is admitted on its reserve (the tokens it may grow to, at most
    ``max_seq_len``) while the reserves of the live slots fit the budget: the caches grow as tokens
    arrive, so that bounds their memory as the paged cache's blocks do."""

    def __init__(self, num_slots: int, max_seq_len: int = 1, budget_tokens: int | None = None) -> None:
        if num_slots < 1:
            raise ValueError(f"num_slots={num_slots} must be >= 1")
        self.num_slots, self.max_seq_len, self.budget_tokens = num_slots, max_seq_len, budget_tokens
        self.caches: dict[int, Any] = {}  # slot -> DynamicCache
        self.lengths: dict[int, int] = {}
        self.reserves: dict[int, int] = {}  # slot -> tokens it may grow to
        self._free_heap = list(range(num_slots))

    def _unreserved(self) -> float:
        if self.budget_tokens is None:
            return float("inf")
        return self.budget_tokens - sum(list(self.reserves.values()))  # a copy: read from other threads too

    def reserve(self, reserve_tokens: int | None) -> int:
        """Tokens a slot reserving ``reserve_tokens`` (None or 0: max_seq_len) may grow to."""
        return min(reserve_tokens or self.max_seq_len, self.max_seq_len)

    @property
    def usage(self) -> float:
        """Share of the token budget the live slots reserved (without one: of the slots)."""
        if self.budget_tokens is None:
            return 1.0 - len(self._free_heap) / self.num_slots
        return 1.0 - max(0.0, self._unreserved()) / self.budget_tokens

    @property
    def num_free(self) -> int:
        """Slots of up to max_seq_len tokens that can still be allocated."""
        return int(min(len(self._free_heap), self._unreserved() // self.max_seq_len))

    def admits(self, reserve_tokens: list[int | None]) -> int:
        """How many of these new sequences, in order, `allocate` would accept now."""
        room = self._unreserved()
        for count, reserve in enumerate(reserve_tokens):
            room -= self.reserve(reserve)
            if count >= len(self._free_heap) or room < 0:
                return count
        return len(reserve_tokens)

    def grow(self, reserves: list[tuple[int, int]], taken: list[int | None] = ()) -> int:
        """Raise live slots' reserves, in order ((slot, tokens) each), while the budget's tokens not
        reserved cover the increase after ``taken`` reserves of sequences not allocated yet; how many
        were raised (it stops at the first that does not fit; a reserve never shrinks here)."""
        room = self._unreserved() - sum(self.reserve(tokens) for tokens in taken)
        for count, (slot, tokens) in enumerate(reserves):
            self.length(slot)  # raises InvalidSlotError for a slot not allocated
            extra = max(0, self.reserve(tokens) - self.reserves[slot])
            if extra > room:
                return count
            room -= extra
            self.reserves[slot] += extra
        return len(reserves)

    def allocate(self, cache: Any, reserve_tokens: int | None = None) -> int:
        reserve = self.reserve(reserve_tokens)
        if not self._free_heap:
            raise CacheFullError(f"KV cache is full: all {self.num_slots} slots are allocated")
        if reserve > self._unreserved():
            raise CacheFullError(f"KV cache is full: {reserve} tokens needed, {self._unreserved():.0f} of "
                                 f"{self.budget_tokens} not reserved by running sequences")
        slot = heapq.heappop(self._free_heap)
        self.caches[slot], self.lengths[slot], self.reserves[slot] = cache, 0, reserve
        return slot

    def free(self, slot: int) -> None:
        self.length(slot)
        del self.caches[slot], self.lengths[slot], self.reserves[slot]
        heapq.heappush(self._free_heap, slot)

    def length(self, slot: int) -> int:
        """Tokens cached in ``slot``; raises InvalidSlotError when it is not allocated."""
        if isinstance(slot, bool) or slot not in self.lengths:
            raise InvalidSlotError(f"slot {slot!r} is not allocated (num_slots={self.num_slots})")
        return self.lengths[slot]


def kv_bytes_per_token(text_config: Any, dtype: torch.dtype) -> int:
    """K and V bytes one token takes in every layer, from a transformers config (an estimate for
    layouts other than one K and V of head_dim per KV head and layer)."""
    heads = getattr(text_config, "num_attention_heads", 1)
    kv_heads = getattr(text_config, "num_key_value_heads", None) or heads
    head_dim = getattr(text_config, "head_dim", None) or text_config.hidden_size // heads
    return 2 * text_config.num_hidden_layers * kv_heads * head_dim * torch.empty(0, dtype=dtype).element_size()


def _sized_max_seq_len(max_seq_len: int | None, context: int, budget_tokens: int | None) -> int:
    """``max_seq_len``, or None: the model's ``context`` at most the budget; ValueError when out of range
    or when the budget cannot hold one such sequence."""
    if max_seq_len is None:
        max_seq_len = context if budget_tokens is None else min(context, budget_tokens)
    if not 1 <= max_seq_len <= context:
        raise ValueError(f"max_seq_len={max_seq_len} must be in [1, max_position_embeddings={context}]")
    if budget_tokens is not None and budget_tokens < max_seq_len:
        raise ValueError(f"cache.memory_budget holds {budget_tokens} tokens of this model's K/V; one sequence of "
                         f"max_seq_len={max_seq_len} needs more: raise cache.memory_budget")
    return max_seq_len


class TransformersRunner:
    """ModelRunner's engine-facing API over a transformers causal LM (see the module docstring)."""

    runner_kind = "transformers"

    def __init__(self, model: Any, num_slots: int, max_seq_len: int | None, memory_budget: float | None = None,
                 kv_tokens: int | None = None) -> None:
        """``memory_budget`` (bytes, or a fraction of device memory; K/V bytes per token estimated from the
        config) or else ``kv_tokens`` bounds the tokens the live slots may reserve (None: slots only);
        ``max_seq_len`` None: the model's context, at most that budget."""
        if getattr(model.config, "is_encoder_decoder", False):
            raise ValueError(f"model_type={model.config.model_type!r} is an encoder-decoder, not a causal LM")
        self.model = model.eval()
        text_config = model.config.get_text_config(decoder=True)
        self.max_position_embeddings = getattr(text_config, "max_position_embeddings", None) or max_seq_len
        if self.max_position_embeddings is None:
            raise ValueError("the model's config has no max_position_embeddings: set cache.max_seq_len")
        budget = kv_tokens
        if memory_budget is not None:
            budget = blocks_in_budget(memory_budget, kv_bytes_per_token(text_config, model.dtype), model.device)
        self.max_seq_len = _sized_max_seq_len(max_seq_len, self.max_position_embeddings, budget)
        self.vocab_size = model.get_output_embeddings().weight.shape[0]
        self.cache = SlotCaches(num_slots, self.max_seq_len, budget)
        params = inspect.signature(model.forward).parameters
        self._cache_arg = "cache" if "cache" in params else "past_key_values"  # renamed in transformers 5.x

    @classmethod
    def from_pretrained(cls, name_or_path: str, num_slots: int = 8, max_seq_len: int | None = 1024,
                        dtype: str | torch.dtype = "float32", device: torch.device | str = "cpu",
                        memory_budget: float | None = None, kv_tokens: int | None = None) -> TransformersRunner:
        """Load with ``AutoModelForCausalLM.from_pretrained`` (a local directory or hub id) and wrap it."""
        from transformers import AutoModelForCausalLM

        from specdec.models.loader import resolve_dtype

        model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=resolve_dtype(dtype))
        return cls(model.to(device).requires_grad_(False), num_slots, max_seq_len, memory_budget, kv_tokens)

    @property
    def num_free_slots(self) -> int:
        return self.cache.num_free

    def allocate_slot(self, reserve_tokens: int | None = None) -> int:
        """A slot whose cache grows as tokens arrive, up to ``reserve_tokens`` (None or 0: max_seq_len),
        which a memory budget counts (raises CacheFullError)."""
        from transformers import DynamicCache

        return self.cache.allocate(DynamicCache(), reserve_tokens)

    def admits(self, reserve_tokens: list[int | None]) -> int:
        """How many of these new sequences (their reserves, in order) `allocate_slot` would take now."""
        return self.cache.admits(reserve_tokens)

    def grow_reserves(self, reserves: list[tuple[int, int]], taken: list[int | None] = ()) -> int:
        """Raise these slots' reserves ((slot, tokens), in order) while the token budget covers them,
        after ``taken`` reserves of sequences not allocated yet; how many were raised. The caches
        grow as tokens arrive, so the engine's grants (admission on the next round's need, growth,
        preemption) bound their memory here as blocks do in the paged cache; without a budget
        every growth fits (admission counts slots)."""
        return self.cache.grow(reserves, taken)

    @property
    def block_capacity(self) -> tuple[int, int]:
        """(budget in tokens, 1): a remote router counts reserves in tokens; (0, 0) without a budget (slots)."""
        budget = self.cache.budget_tokens
        return (0, 0) if budget is None else (budget, 1)

    @property
    def cache_usage(self) -> float:
        """Share of the token budget reserved by live slots (without one: of the slots)."""
        return self.cache.usage

    def cached_tokens(self, slot: int) -> int:
        """Always 0: this runner has no prefix cache."""
        self.cache.length(slot)
        return 0

    def free_slot(self, slot: int) -> None:
        self.cache.free(slot)

    def slot_length(self, slot: int) -> int:
        return self.cache.length(slot)

    def _lengths(self, slots: list[int]) -> list[int]:
        return [self.cache.length(slot) for slot in slots]

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
        fork = self.cache.allocate(copy.deepcopy(self.cache.caches[slot]), self.cache.reserves[slot])
        self.cache.lengths[fork] = current
        self.truncate(fork, length)
        return fork

    @torch.inference_mode()
    def forward(self, slot_ids: list[int], token_ids: list[list[int]], last_only: bool = False) -> torch.Tensor:
        """Same contract as ModelRunner.forward: float32 logits [B, T, V] (T = longest row; entries past a row's
        length are zero) or, with ``last_only``, [B, V] at each row's last token. Rows run one at a time."""
        lengths = check_forward_request(slot_ids, token_ids, self._lengths, self.vocab_size, self.max_seq_len)
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
