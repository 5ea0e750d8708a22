"""lm-evaluation-harness against the HTTP server: its `local-completions` model runs a tiny
loglikelihood task shipped in tests/data/lm_eval (echo + logprobs, token-id prompts,
the bundled tokenizer from local files) and every loglikelihood it computes equals the
in-process target's (log_softmax over context + continuation) to 1e-4; its
`local-chat-completions` model runs a generate_until task through the chat template. No
network: the datasets are local JSON, the tokenizer a local directory. The server is the
package's shared one (tests/specdec_http/conftest.py: 4 slots, a 256-token context)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from specdec.models.model_paths import resolve_model_path

lm_eval = pytest.importorskip("lm_eval")

MODEL = "bundled:target"
ROOT = Path(__file__).resolve().parents[2]
TASKS = ROOT / "tests" / "data" / "lm_eval"


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.chdir(ROOT)  # the tasks name their data relative to the repository root
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.setenv(name, "1")


def evaluate(model, task: str, **kwargs) -> dict:
    from lm_eval.tasks import TaskManager

    # only the tiny tasks shipped here: indexing lm-eval's own few thousand task files takes seconds
    tasks = TaskManager(include_path=str(TASKS), include_defaults=False)
    return lm_eval.simple_evaluate(model=model, tasks=[task], task_manager=tasks, log_samples=True, **kwargs)


@pytest.mark.slow
def test_local_completions_loglikelihoods_equal_the_in_process_target(server, hf_target):
    from lm_eval.models.openai_completions import LocalCompletionsAPI

    lm = LocalCompletionsAPI(base_url=f"{server.url}/v1/completions", model=MODEL, tokenizer_backend="huggingface",
                             tokenizer=str(resolve_model_path(MODEL)), tokenized_requests=True, max_retries=1)
    results = evaluate(lm, "specdec_tiny_choice")
    samples = results["samples"]["specdec_tiny_choice"]
    assert len(samples) == 4 and 0.0 <= results["results"]["specdec_tiny_choice"]["acc,none"] <= 1.0
    for sample in samples:
        for (context, continuation), [(loglikelihood, _)] in zip(sample["arguments"], sample["resps"]):
            context_ids, continuation_ids = lm._encode_pair(context, continuation)
            ids = torch.tensor([context_ids + continuation_ids])
            with torch.no_grad():
                logprobs = torch.log_softmax(hf_target(ids).logits[0, :-1].double(), -1)
            expected = logprobs[len(context_ids) - 1:].gather(-1, torch.tensor(continuation_ids)[:, None]).sum()
            assert loglikelihood == pytest.approx(expected.item(), abs=1e-4)


@pytest.mark.slow
def test_local_chat_completions_runs_a_generate_until_task(server):
    results = evaluate("local-chat-completions", "specdec_tiny_generate", apply_chat_template=True,
                       model_args=f"base_url={server.url}/v1/chat/completions,model={MODEL},max_retries=1")
    samples = results["samples"]["specdec_tiny_generate"]
    assert len(samples) == 2 and all(isinstance(s["resps"][0][0], str) for s in samples)
    assert "exact_match,none" in results["results"]["specdec_tiny_generate"]
