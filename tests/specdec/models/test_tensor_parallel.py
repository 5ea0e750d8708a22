"""Tensor parallelism: a 2-rank sharded model (gloo, CPU) reproduces the unsharded logits; bad sizes fail clearly."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from specdec.models import ModelRunner, RowParallelLinear, load_model, shard_model

WORLD_SIZE = 2
# every bias kind incl. row-parallel ones; decoupled head_dim + window; per-head q/k norms (replicated);
# Gemma's sandwich norms, soft-capped scores and logits, and a second RoPE on sliding layers; Phi-3's fused
# projections (split at load, before sharding)
TP_FAMILIES = ["llama_biased", "mistral", "qwen3_sliding_biased", "gemma3", "gemma2", "phi3"]


def run_scenario(runner: ModelRunner) -> list[torch.Tensor]:
    """Ragged prefill, a decode step, a verification step, a rollback and a last-only step; real-token logits."""
    gen = torch.Generator().manual_seed(0)

    def toks(n: int) -> list[int]:
        return torch.randint(0, 256, (n,), generator=gen).tolist()

    slots = [runner.allocate_slot() for _ in range(3)]
    outputs = []
    for counts in ([7, 3, 5], [1, 1, 1], [3, 1, 4]):
        rows = [toks(n) for n in counts]
        logits = runner.forward(slots, rows)
        outputs += [logits[b, :n] for b, n in enumerate(counts)]
    runner.truncate(slots[0], runner.slot_length(slots[0]) - 2)
    outputs.append(runner.forward(slots, [toks(2), toks(1), toks(3)], last_only=True))
    return outputs


def _tp_worker(rank: int, port: int, checkpoints: list[str], out_dir: str) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD_SIZE)
    try:
        results = {}
        for path in checkpoints:
            model = shard_model(load_model(path), rank=rank, world_size=WORLD_SIZE)
            results[path] = run_scenario(ModelRunner(model, num_slots=3, max_seq_len=32))
        torch.save(results, Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_rank_sharded_model_matches_unsharded_logits(tiny_checkpoint, tmp_path):
    checkpoints = [str(tiny_checkpoint(family)) for family in TP_FAMILIES]
    mp.spawn(_tp_worker, args=(_free_port(), checkpoints, str(tmp_path)), nprocs=WORLD_SIZE, join=True)
    for path in checkpoints:
        expected = run_scenario(ModelRunner(load_model(path), num_slots=3, max_seq_len=32))
        for rank in range(WORLD_SIZE):
            actual = torch.load(tmp_path / f"rank{rank}.pt")[path]
            for step, (a, e) in enumerate(zip(actual, expected, strict=True)):
                diff = (a - e).abs().max().item()
                assert diff <= 1e-5, f"{Path(path).name} rank {rank} output {step}: max |Δ| = {diff:.3g}"


def test_sharding_splits_heads_and_features_per_rank(tiny_checkpoint):
    model = shard_model(load_model(str(tiny_checkpoint("llama_biased"))), rank=1, world_size=2)
    attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    assert (attn.num_heads, attn.num_kv_heads) == (2, 1)
    assert attn.q_proj.weight.shape == (2 * 16, 64) and attn.q_proj.bias.shape == (32,)
    assert attn.k_proj.weight.shape == (16, 64) and attn.v_proj.bias.shape == (16,)
    assert isinstance(attn.o_proj, RowParallelLinear) and attn.o_proj.weight.shape == (64, 32)
    assert mlp.gate_proj.weight.shape == (64, 64) and isinstance(mlp.down_proj, RowParallelLinear)
    assert model.lm_head.weight.shape == (256, 64)  # vocab stays replicated
    assert ModelRunner(model, num_slots=1, max_seq_len=8).cache.num_kv_heads == 1


def test_world_size_one_leaves_the_model_unchanged(tiny_checkpoint):
    model = load_model(str(tiny_checkpoint("llama")))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert shard_model(model, rank=0, world_size=1) is model
    after = model.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)


@pytest.mark.parametrize(
    "world_size, field",
    [(3, "num_attention_heads=4"), (4, "num_key_value_heads=2"), (8, "num_attention_heads=4")],
)
def test_non_divisible_sizes_raise_naming_the_field(tiny_checkpoint, world_size, field):
    model = load_model(str(tiny_checkpoint("llama")))
    with pytest.raises(ValueError, match=f"{field} is not divisible by tensor-parallel world_size={world_size}"):
        shard_model(model, rank=0, world_size=world_size)


def test_invalid_rank_or_double_sharding_raise(tiny_checkpoint):
    model = load_model(str(tiny_checkpoint("llama")))
    with pytest.raises(ValueError, match="rank=2"):
        shard_model(model, rank=2, world_size=2)
    shard_model(model, rank=0, world_size=2)  # no collective runs while sharding
    with pytest.raises(ValueError, match="already sharded"):
        shard_model(model, rank=0, world_size=2)
