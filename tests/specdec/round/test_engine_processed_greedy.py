"""Penalties and logit_bias under speculation: greedy output equals transformers' generate()
with the same processors, token for token, with speculation on and off.

The reference runs the target alone with transformers' own RepetitionPenaltyLogitsProcessor
and SequenceBiasLogitsProcessor, and OpenAI's frequency / presence penalties (over the
generated tokens) written here from their definition.
"""

from __future__ import annotations

import pytest
import torch
from transformers import LogitsProcessor, LogitsProcessorList, RepetitionPenaltyLogitsProcessor
from transformers import SequenceBiasLogitsProcessor

from specdec.requests.request import GenerationRequest
from specdec.sampling.sampling_params import SamplingParams

MAX_NEW = 32


class OpenAIPenalties(LogitsProcessor):
    """logit - frequency * count - presence * [count > 0], count over the generated tokens."""

    def __init__(self, num_prompt_tokens: int, frequency: float, presence: float) -> None:
        self.num_prompt_tokens, self.frequency, self.presence = num_prompt_tokens, frequency, presence

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        output = input_ids[:, self.num_prompt_tokens :]
        count = torch.zeros_like(scores).scatter_add_(1, output, torch.ones_like(output, dtype=scores.dtype))
        return scores - self.frequency * count - self.presence * (count > 0).to(scores.dtype)


def _hf_processed_greedy(hf_target, tokenizer, prompt: list[int], params: SamplingParams) -> list[int]:
    processors = []
    if params.logit_bias:
        processors.append(SequenceBiasLogitsProcessor({(t,): b for t, b in params.logit_bias}))
    if params.repetition_penalty != 1.0:
        processors.append(RepetitionPenaltyLogitsProcessor(params.repetition_penalty))
    processors.append(OpenAIPenalties(len(prompt), params.frequency_penalty, params.presence_penalty))
    out = hf_target.generate(
        torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long), do_sample=False,
        max_new_tokens=MAX_NEW, pad_token_id=tokenizer.eos_token_id, logits_processor=LogitsProcessorList(processors),
    )
    return out[0, len(prompt) :].tolist()


PARAMS = {
    "repetition 1.3": SamplingParams(repetition_penalty=1.3),
    "frequency 0.8 presence 0.4": SamplingParams(frequency_penalty=0.8, presence_penalty=0.4),
    "all, with logit_bias": SamplingParams(repetition_penalty=1.15, frequency_penalty=0.3, presence_penalty=0.2,
                                           logit_bias={13: 2.0, 198: -3.0, 220: 1.0}),
}


@pytest.fixture(scope="module")
def engine(make_engine):
    return make_engine("draft", gamma=4).engine


@pytest.mark.slow
@pytest.mark.parametrize("name", list(PARAMS))
def test_processed_greedy_output_equals_transformers_with_speculation_on_and_off(
        engine, hf_target, tokenizer, prompt_ids, hf_greedy, name):
    params = PARAMS[name]
    prompts = prompt_ids[:2]
    expected = [_hf_processed_greedy(hf_target, tokenizer, p, params) for p in prompts]
    assert any(e != hf_greedy(p, MAX_NEW) for e, p in zip(expected, prompts)), "the processors change nothing here"
    for gamma in (4, 0):  # speculation on, then off
        results = engine.generate([GenerationRequest(p, MAX_NEW, sampling=params, gamma=gamma) for p in prompts])
        assert [r.token_ids for r in results] == expected, f"gamma {gamma}"
    assert engine.stats.accepted > 0


@pytest.mark.slow
def test_a_seeded_sampled_request_with_penalties_gives_the_same_text_with_speculation_on_and_off(
        engine, prompt_ids):
    """The coupled rule over the processed p: each token is a function of the processed
    distribution and (seed, position) alone, so what was drafted changes nothing."""
    params = SamplingParams(temperature=0.9, seed=21, repetition_penalty=1.2, presence_penalty=0.6,
                            frequency_penalty=0.3, min_p=0.02, logit_bias={13: 1.5})
    runs = {gamma: engine.generate([GenerationRequest(p, MAX_NEW, sampling=params, gamma=gamma)
                                    for p in prompt_ids[:2]]) for gamma in (4, 0)}
    assert [r.token_ids for r in runs[4]] == [r.token_ids for r in runs[0]]
    assert sum(r.stats.accepted for r in runs[4]) > 0
    plain_request = GenerationRequest(prompt_ids[0], MAX_NEW, sampling=SamplingParams(temperature=0.9, seed=21))
    plain = engine.generate([plain_request])
    assert plain[0].token_ids != runs[0][0].token_ids, "the processing changes this request's text"
