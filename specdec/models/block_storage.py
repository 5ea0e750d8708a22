"""BlockStorage: the tensors of a paged KV cache, and the pool rows a (slot, position) maps to.

Per layer, one pool ``[num_blocks + 1, block_size, num_kv_heads, head_dim]`` for K and one for
V; a ``[num_slots + 1, blocks_per_seq]`` block-table tensor lists each slot's blocks in position
order, so position ``p`` of slot ``s`` is pool row ``table[s, p // block_size] * block_size +
p % block_size``. Which blocks a slot lists, and when, is `KVCache`'s bookkeeping; this holds
the tensors and addresses them.

The extra block ``num_blocks`` is *scratch*: the padding tokens of ragged batches write there
(slot ``scratch_slot``'s table points only to it), and unused table entries point there too.
"""

from __future__ import annotations

import numpy as np
import torch

from specdec.models.pool_sizing import blocks_for as _blocks_for


def _check_positive(**values: int) -> None:
    for name, value in values.items():
        if value < 1:
            raise ValueError(f"{name}={value} must be >= 1")


def _pool_rows(table, block_size: int, slots, positions):
    """Pool rows of (slot, position) pairs through ``table`` (a tensor, or its NumPy view)."""
    return table[slots, positions // block_size] * block_size + positions % block_size


class BlockStorage:
    """K/V block pools per layer and the block-table tensor (see the module docstring)."""

    def __init__(
        self,
        num_layers: int,
        num_slots: int,
        max_seq_len: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
        block_size: int,
        num_blocks: int | None,
    ) -> None:
        """``num_blocks`` None: enough for every slot at ``max_seq_len``."""
        _check_positive(num_layers=num_layers, num_slots=num_slots, max_seq_len=max_seq_len,
                        num_kv_heads=num_kv_heads, head_dim=head_dim, block_size=block_size)
        self.num_layers, self.num_slots, self.max_seq_len = num_layers, num_slots, max_seq_len
        self.num_kv_heads, self.head_dim, self.block_size = num_kv_heads, head_dim, block_size
        self.blocks_per_seq = _blocks_for(max_seq_len, block_size)
        num_blocks = num_slots * self.blocks_per_seq if num_blocks is None else num_blocks
        if num_blocks < self.blocks_per_seq:
            raise ValueError(f"num_blocks={num_blocks} cannot hold one sequence of max_seq_len={max_seq_len} "
                             f"({self.blocks_per_seq} blocks of {block_size} tokens)")
        self.scratch_slot, self.scratch_block = num_slots, num_blocks
        shape = (num_blocks + 1, block_size, num_kv_heads, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        # [num_slots + 1, blocks_per_seq]: block of each (slot, position // block_size)
        self.block_table = torch.full((num_slots + 1, self.blocks_per_seq), num_blocks, dtype=torch.long,
                                      device=device)
        # entries written from the host: through a NumPy view of the table's own memory on the CPU (a
        # tensor write per entry costs microseconds of dispatch), else the tensor itself
        self._table_view = self.block_table.numpy() if self.block_table.device.type == "cpu" else self.block_table

    @staticmethod
    def block_bytes(num_layers: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        """Bytes one block takes: K and V of ``block_size`` tokens in every layer."""
        return 2 * num_layers * block_size * num_kv_heads * head_dim * torch.empty(0, dtype=dtype).element_size()

    def copy_block(self, source: int, target: int) -> None:
        """Copy block ``source``'s K/V into block ``target``, in every layer."""
        for keys, values in zip(self.keys, self.values):
            keys[target] = keys[source]
            values[target] = values[source]

    def flat_index(self, slots: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Row of each (slot, position) in a layer's pool viewed as [(num_blocks + 1) * block_size, ...];
        ``slots`` and ``positions`` broadcast (int64, positions < max_seq_len)."""
        return _pool_rows(self.block_table, self.block_size, slots, positions)

    def host_flat_index(self, slots: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """`flat_index` over NumPy arrays, through the table's NumPy view (a cache on the CPU):
        for host code that reads or writes the pools through NumPy views of them."""
        return _pool_rows(self._table_view, self.block_size, slots, positions)

    def read_index(self, slot_ids: torch.Tensor, kv_len: int) -> torch.Tensor:
        """[batch, kv_len] pool rows of each slot's first ``kv_len`` positions (slot_ids: [batch])."""
        assert slot_ids.dim() == 1, f"slot_ids must be [batch], got {tuple(slot_ids.shape)}"
        assert 1 <= kv_len <= self.max_seq_len, f"kv_len={kv_len} out of [1, {self.max_seq_len}]"
        return self.flat_index(slot_ids[:, None], torch.arange(kv_len, device=slot_ids.device)[None])

    def write(self, layer: int, index: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Store K/V of new tokens at pool rows ``index`` (from `flat_index`, e.g. [batch, seq]);
        keys, values: [*index.shape, num_kv_heads, head_dim]. Rows must have been `KVCache.prepare`d."""
        assert keys.shape == values.shape == (*index.shape, self.num_kv_heads, self.head_dim), (
            f"index {tuple(index.shape)}, keys {tuple(keys.shape)}, values {tuple(values.shape)}")
        rows, width = index.reshape(-1), (-1, self.num_kv_heads, self.head_dim)
        self.keys[layer].view(width).index_copy_(0, rows, keys.reshape(width))
        self.values[layer].view(width).index_copy_(0, rows, values.reshape(width))

    def gather(self, layer: int, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V at pool rows ``index`` (e.g. `read_index`'s [batch, kv_len]), each
        [*index.shape, kv_heads, head_dim]."""
        rows, width, shape = index.reshape(-1), (-1, self.num_kv_heads, self.head_dim), index.shape
        keys = self.keys[layer].view(width).index_select(0, rows)  # [rows, kv_heads, head_dim]
        values = self.values[layer].view(width).index_select(0, rows)
        return keys.view(*shape, *width[1:]), values.view(*shape, *width[1:])
