"""Tensor parallelism as a transformation of an ordinary :class:`LlamaForServing`.

``shard_model`` keeps this rank's slice of every projection (Megatron layout):

* column-parallel q/k/v/gate/up: output features split (q/k/v biases too), so each rank
  owns ``num_heads / world_size`` query heads and ``num_kv_heads / world_size`` K/V heads;
* row-parallel o_proj/down_proj: input features split, partial outputs summed with
  ``torch.distributed.all_reduce`` (bias added once, after the reduction);
* embeddings, norms (the per-head q/k norms of Qwen3 / Gemma 3 included: one weight per head
  dimension, shared by all heads) and lm_head stay replicated, so every rank returns full logits;
  soft-capping acts per score / per logit, so it needs nothing either.

The model code itself is unchanged; with ``world_size == 1`` nothing is modified.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from specdec.models.llama import LlamaAttention, LlamaForServing, LlamaMLP


class RowParallelLinear(nn.Module):
    """Linear layer holding a slice of input features; sums partial results across the group."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, world_size: int, group=None) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)  # [out_features, in_features / world_size]
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)  # [out_features]
        self.world_size = world_size
        self.group = group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., in_features / world_size] -> [..., out_features], reduced over the group."""
        assert x.shape[-1] == self.weight.shape[1], f"x {tuple(x.shape)} vs weight {tuple(self.weight.shape)}"
        out = F.linear(x, self.weight)
        if self.world_size > 1:
            dist.all_reduce(out, op=dist.ReduceOp.SUM, group=self.group)
        return out if self.bias is None else out + self.bias


def shard_model(model: LlamaForServing, rank: int, world_size: int, group=None) -> LlamaForServing:
    """Shard ``model`` in place for ``rank`` of ``world_size`` and return it.

    Raises ValueError when heads / K/V heads / intermediate size do not divide by ``world_size``.
    """
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"invalid tensor-parallel rank={rank} for world_size={world_size}")
    if getattr(model, "tp_world_size", 1) != 1:
        raise ValueError(f"model is already sharded (tp_world_size={model.tp_world_size})")
    check_divisible(model, world_size)
    if world_size == 1:
        return model
    if getattr(model, "is_emulated", False):  # no weights: each rank emulates the group's forward time
        model.tp_rank, model.tp_world_size = rank, world_size
        return model
    for layer in model.model.layers:
        _shard_attention(layer.self_attn, rank, world_size, group)
        _shard_mlp(layer.mlp, rank, world_size, group)
    model.tp_rank = rank
    model.tp_world_size = world_size
    return model


def check_divisible(model: LlamaForServing, world_size: int) -> None:
    """Raise ValueError naming the first field that ``world_size`` does not divide."""
    config = model.config
    for name in ("num_attention_heads", "num_key_value_heads", "intermediate_size"):
        value = getattr(config, name)
        if value % world_size != 0:
            raise ValueError(f"{name}={value} is not divisible by tensor-parallel world_size={world_size}")


def _shard_attention(attn: LlamaAttention, rank: int, world_size: int, group) -> None:
    attn.q_proj = _column_slice(attn.q_proj, rank, world_size)
    attn.k_proj = _column_slice(attn.k_proj, rank, world_size)
    attn.v_proj = _column_slice(attn.v_proj, rank, world_size)
    attn.o_proj = _row_slice(attn.o_proj, rank, world_size, group)
    attn.num_heads //= world_size
    attn.num_kv_heads //= world_size


def _shard_mlp(mlp: LlamaMLP, rank: int, world_size: int, group) -> None:
    mlp.gate_proj = _column_slice(mlp.gate_proj, rank, world_size)
    mlp.up_proj = _column_slice(mlp.up_proj, rank, world_size)
    mlp.down_proj = _row_slice(mlp.down_proj, rank, world_size, group)


def _column_slice(linear: nn.Linear, rank: int, world_size: int) -> nn.Linear:
    """Keep this rank's block of output features (weight rows and bias)."""
    out_features = linear.out_features // world_size
    rows = slice(rank * out_features, (rank + 1) * out_features)
    weight = linear.weight.detach()[rows].clone()  # [out_features / world_size, in_features]
    sliced = nn.Linear(linear.in_features, out_features, bias=linear.bias is not None,
                       device="meta", dtype=weight.dtype)
    sliced.weight = nn.Parameter(weight, requires_grad=False)
    if linear.bias is not None:
        sliced.bias = nn.Parameter(linear.bias.detach()[rows].clone(), requires_grad=False)
    return sliced


def _row_slice(linear: nn.Linear, rank: int, world_size: int, group) -> RowParallelLinear:
    """Keep this rank's block of input features (weight columns); the bias stays whole."""
    in_features = linear.in_features // world_size
    cols = slice(rank * in_features, (rank + 1) * in_features)
    weight = linear.weight.detach()[:, cols].clone()  # [out_features, in_features / world_size]
    bias = None if linear.bias is None else linear.bias.detach().clone()
    return RowParallelLinear(weight, bias, world_size, group)
