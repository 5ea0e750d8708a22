"""Speculative decoding over the newer families, on the own runtime (Qwen3, Gemma 2/3, Phi-3) and on the
transformers fallback (gpt2, Phi-3 with partial rotary): greedy output equals transformers'
generate(do_sample=False), with a
draft that agrees with the target (accepted and bonus tokens) and with one that does not (rejections,
recovered tokens and rollbacks)."""

from __future__ import annotations

import pytest
import torch

from specdec.round.engine import SpeculativeEngine
from specdec.models.runners import open_runner
from specdec.proposers.draft_proposer import DraftModelProposer
from specdec.requests.request import GenerationRequest
from specdec.verifiers.target_verifier import TargetVerifier

MAX_NEW = 20
PROMPTS = [[5, 17, 99, 3, 250, 42, 8], [200, 1, 77], [9] * 12 + [31, 64]]


def hf_greedy(path, prompt: list[int], eos: int | None) -> list[int]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()
    out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                         do_sample=False, max_new_tokens=MAX_NEW, eos_token_id=eos, pad_token_id=eos)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize(
    "family", ["qwen3", "qwen3_sliding_biased", "gemma2", "gemma3", "phi3", "gpt2", "phi3_partial_rotary"]
)
@pytest.mark.parametrize("draft_agrees", [True, False])
def test_greedy_speculation_equals_transformers_generate(tiny_checkpoint, family, draft_agrees):
    target_path = tiny_checkpoint(family)
    other = "qwen3_sliding_biased" if family == "qwen3" else "qwen3"  # same vocabulary, another model
    draft_path = target_path if draft_agrees else tiny_checkpoint(other)
    target = open_runner(str(target_path), num_slots=4, max_seq_len=64)
    draft = open_runner(str(draft_path), num_slots=8, max_seq_len=64)
    eos = 1  # a real stop token for both sides, so stopping is compared too
    engine = SpeculativeEngine(TargetVerifier(target), DraftModelProposer(draft, draft.vocab_size), gamma=3,
                               eos_token_ids=[eos])
    results = engine.generate([GenerationRequest(p, MAX_NEW) for p in PROMPTS])
    assert [r.token_ids for r in results] == [hf_greedy(target_path, p, eos) for p in PROMPTS]
    if draft_agrees:
        assert engine.stats.accepted > 0
    else:
        assert engine.stats.drafted > engine.stats.accepted


def test_the_configured_transformers_runner_serves_the_same_greedy_output(make_engine, prompt_ids, hf_greedy):
    """models.runner: transformers puts both bundled models on the fallback; the output does not change."""
    built = make_engine("draft", gamma=4, models={"runner": "transformers"})
    assert built.engine.verifier.runner_kind == "transformers"
    results = built.engine.generate([GenerationRequest(p, 24) for p in prompt_ids[:2]])
    assert [r.token_ids for r in results] == [hf_greedy(p, 24) for p in prompt_ids[:2]]
    assert built.engine.stats.accepted > 0
