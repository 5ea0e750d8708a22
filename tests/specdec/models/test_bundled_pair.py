"""The repo ships a tiny target/draft pair that loads with transformers and with specdec's runtime."""

import json

import torch

from specdec.models.model_paths import BUNDLED_DIR, bundled_prompts
from specdec.models.model_runner import ModelRunner

MB = 1024 * 1024


def test_the_pair_is_small_and_stored_in_half_precision():
    total = sum(p.stat().st_size for p in BUNDLED_DIR.rglob("*") if p.is_file())
    assert total <= 20 * MB
    for name in ("target", "draft"):
        config = json.loads((BUNDLED_DIR / name / "config.json").read_text())
        assert config["model_type"] == "llama" and config["dtype"] in ("float16", "bfloat16")


def test_the_draft_is_much_smaller_than_the_target(hf_target):
    from transformers import AutoModelForCausalLM

    draft = AutoModelForCausalLM.from_pretrained(BUNDLED_DIR / "draft")
    n_target = sum(p.numel() for p in hf_target.parameters())
    n_draft = sum(p.numel() for p in draft.parameters())
    assert 5e6 <= n_target <= 10e6 and n_draft * 3 < n_target


def test_the_runtime_matches_transformers_on_the_bundled_target(hf_target, prompt_ids):
    runner = ModelRunner.from_pretrained(str(BUNDLED_DIR / "target"), num_slots=1, max_seq_len=256)
    prompt = prompt_ids[0]
    slot = runner.allocate_slot()
    ours = runner.forward([slot], [prompt])[0]
    with torch.no_grad():
        ref = hf_target(torch.tensor([prompt])).logits[0]
    assert (ours - ref).abs().max().item() <= 1e-4


def test_model_card_and_heldout_prompts_are_shipped():
    card = (BUNDLED_DIR / "MODEL_CARD.md").read_text()
    assert "held-out loss" in card.lower() and "acceptance" in card.lower()
    assert len(bundled_prompts()) >= 8
