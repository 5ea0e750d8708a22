"""How many blocks a paged KV cache gets: from a memory budget (bytes, or a share of the
device's memory), a token budget, or one sequence of ``max_seq_len`` per slot (`KVCache`)."""

from __future__ import annotations

import os

import torch


def blocks_for(tokens: int, block_size: int) -> int:
    """Blocks of ``block_size`` that ``tokens`` tokens fill (the last one partly)."""
    return -(-tokens // block_size)


def device_memory_bytes(device: torch.device | str) -> int:
    """Total memory of ``device``: the GPU's, or the host's RAM for the CPU."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def blocks_in_budget(memory_budget: float, block_bytes: int, device: torch.device | str) -> int:
    """Blocks of ``block_bytes`` (K and V, all layers) that ``memory_budget`` holds: bytes when > 1,
    else a fraction (0, 1] of the device's total memory."""
    if memory_budget <= 0:
        raise ValueError(f"memory_budget={memory_budget} must be > 0 (bytes, or a fraction of device memory <= 1)")
    budget = memory_budget if memory_budget > 1 else memory_budget * device_memory_bytes(device)
    return int(budget // block_bytes)


def size_pool(context: int, num_slots: int, max_seq_len: int | None, block_size: int, block_bytes: int,
              device: torch.device | str, memory_budget: float | None = None,
              kv_tokens: int | None = None) -> tuple[int, int | None]:
    """(max_seq_len, num_blocks) of a model's paged cache. The blocks ``memory_budget`` (bytes, or a
    fraction of the device's memory) or else ``kv_tokens`` hold, at most ``num_slots`` sequences of
    max_seq_len (more could never be used); neither given: None (KVCache's own default, exactly
    ``num_slots`` such sequences). ``max_seq_len`` None: the model's ``context``, at most what the
    blocks hold. ValueError when they cannot hold one sequence of max_seq_len."""
    if memory_budget is not None:
        blocks, source = blocks_in_budget(memory_budget, block_bytes, device), f"cache.memory_budget={memory_budget:g}"
    elif kv_tokens is not None:
        blocks, source = blocks_for(kv_tokens, block_size), f"the default cache.memory_budget ({kv_tokens} tokens)"
    else:
        return (context if max_seq_len is None else max_seq_len), None
    if max_seq_len is None:
        max_seq_len = min(context, blocks * block_size)
    per_seq = blocks_for(max(max_seq_len, 1), block_size)
    if blocks < per_seq:
        raise ValueError(f"{source} holds {blocks} blocks of {block_size} tokens ({block_bytes} bytes each); one "
                         f"sequence of max_seq_len={max_seq_len} needs {per_seq}: raise cache.memory_budget")
    return max_seq_len, min(blocks, num_slots * per_seq)
