"""Every runner reproduces transformers' logits exactly (fp32, |Δ| <= 1e-4) in every serving pattern:
prefill, incremental decoding, ragged multi-token verification batches and rollbacks. The own runtime
serves the families it implements; what it does not (gpt2; Phi-3 with partial rotary) gets the transformers fallback,
which is also checked on sliding-window families, where a rollback must not lose evicted entries."""

from __future__ import annotations

import pytest
import torch

from specdec.models import ModelRunner
from specdec.models.runners import open_runner

ATOL = 1e-4
FAMILIES = [
    "llama", "llama3_rope_tied", "qwen2", "qwen2_sliding_tied", "mistral", "qwen3", "qwen3_sliding_biased",
    "gemma2", "gemma3", "phi3",
]


def _tokens(seed: int, n: int) -> list[int]:
    return torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _assert_close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert actual.shape == expected.shape
    assert actual.dtype == torch.float32
    diff = (actual - expected).abs().max().item()
    assert diff <= ATOL, f"max |Δ| = {diff:.3g} > {ATOL}"


# (family, runner choice, the runner it must get)
CASES = [(family, "auto", "specdec") for family in FAMILIES] + [
    ("gpt2", "auto", "transformers"),
    ("phi3_partial_rotary", "auto", "transformers"),
    ("gemma2", "transformers", "transformers"),
    ("qwen2_sliding_tied", "transformers", "transformers"),
]


@pytest.fixture(params=CASES, ids=lambda case: f"{case[0]}-{case[2]}")
def case(request: pytest.FixtureRequest) -> tuple[str, str, str]:
    return request.param


@pytest.fixture
def family(case) -> str:
    return case[0]


@pytest.fixture
def runner(case, tiny_checkpoint) -> ModelRunner:
    family, choice, kind = case
    opened = open_runner(str(tiny_checkpoint(family)), num_slots=4, max_seq_len=64, choice=choice)
    assert opened.runner_kind == kind
    return opened


def test_prefill_logits_match_transformers(family, runner, tiny_checkpoint, reference_logits):
    tokens = _tokens(0, 12)
    slot = runner.allocate_slot()
    logits = runner.forward([slot], [tokens])  # [1, 12, V]
    _assert_close(logits[0], reference_logits(tiny_checkpoint(family), tokens))


def test_incremental_steps_match_transformers_on_the_whole_sequence(family, runner, tiny_checkpoint, reference_logits):
    tokens = _tokens(1, 14)
    expected = reference_logits(tiny_checkpoint(family), tokens)
    slot = runner.allocate_slot()
    chunks = [(0, 6), (6, 7), (7, 8), (8, 9), (9, 12), (12, 14)]  # prefill, single steps, multi-token steps
    for start, end in chunks:
        logits = runner.forward([slot], [tokens[start:end]])
        _assert_close(logits[0], expected[start:end])
    assert runner.slot_length(slot) == len(tokens)


def test_ragged_batch_with_several_new_tokens_per_row_equals_each_sequence_alone(
    family, runner, tiny_checkpoint, reference_logits
):
    path = tiny_checkpoint(family)
    prefixes = [_tokens(10, 9), _tokens(11, 2), _tokens(12, 6)]
    drafts = [_tokens(20, 3), _tokens(21, 1), _tokens(22, 5)]  # like gamma+1 verification tokens
    slots = [runner.allocate_slot() for _ in prefixes]
    runner.forward(slots, prefixes)  # ragged prefill in one call
    logits = runner.forward(slots, drafts)  # [3, 5, V], one verification call
    assert logits.shape == (3, 5, runner.vocab_size)
    for row, (prefix, draft) in enumerate(zip(prefixes, drafts)):
        expected = reference_logits(path, prefix + draft)[len(prefix):]
        _assert_close(logits[row, : len(draft)], expected)
        assert runner.slot_length(slots[row]) == len(prefix) + len(draft)


def test_after_rollback_new_tokens_match_transformers_on_the_final_sequence(
    family, runner, tiny_checkpoint, reference_logits
):
    path = tiny_checkpoint(family)
    prefixes = [_tokens(30, 8), _tokens(31, 5)]
    slots = [runner.allocate_slot() for _ in prefixes]
    runner.forward(slots, prefixes)
    rejected = [_tokens(40, 4), _tokens(41, 3)]
    runner.forward(slots, rejected)
    keep = [1, 0]  # accepted draft tokens per row; the rest is rolled back
    for slot, prefix, k in zip(slots, prefixes, keep):
        runner.truncate(slot, len(prefix) + k)
    fresh = [_tokens(50, 2), _tokens(51, 4)]
    logits = runner.forward(slots, fresh)
    for row in range(2):
        final = prefixes[row] + rejected[row][: keep[row]] + fresh[row]
        expected = reference_logits(path, final)[-len(fresh[row]):]
        _assert_close(logits[row, : len(fresh[row])], expected)
        assert runner.slot_length(slots[row]) == len(final)


def test_last_only_returns_logits_at_each_rows_last_token(family, runner, tiny_checkpoint, reference_logits):
    path = tiny_checkpoint(family)
    rows = [_tokens(60, 7), _tokens(61, 3)]
    slots = [runner.allocate_slot() for _ in rows]
    logits = runner.forward(slots, rows, last_only=True)
    assert logits.shape == (2, runner.vocab_size)
    for row, tokens in enumerate(rows):
        _assert_close(logits[row], reference_logits(path, tokens)[-1])


def test_fp16_checkpoint_loads_as_float32_and_matches_transformers(tiny_checkpoint, reference_logits):
    path = tiny_checkpoint("qwen2", dtype=torch.float16)
    runner = ModelRunner.from_pretrained(str(path), num_slots=1, max_seq_len=32, dtype="float32")
    assert runner.model.dtype == torch.float32
    tokens = _tokens(70, 10)
    slot = runner.allocate_slot()
    _assert_close(runner.forward([slot], [tokens])[0], reference_logits(path, tokens))
