"""Speculation may only change speed: greedy output equals the target alone, token for token."""

import pytest

from specdec.requests.request import GenerationRequest

MAX_NEW = 48


@pytest.mark.parametrize(
    "proposer, gamma",
    [("draft", 1), ("draft", 3), ("draft", 5), ("draft", 8), ("ngram", 4), ("none", 0)],
)
def test_each_prompt_alone_equals_transformers_generate(make_engine, prompt_ids, hf_greedy, proposer, gamma):
    built = make_engine(proposer, gamma)
    for prompt in prompt_ids[:4]:
        [result] = built.engine.generate([GenerationRequest(prompt, MAX_NEW)])
        assert result.token_ids == hf_greedy(prompt, MAX_NEW)


@pytest.mark.parametrize("proposer", ["draft", "ngram"])
def test_a_batch_of_prompts_of_different_lengths_equals_each_run_alone(make_engine, prompt_ids, hf_greedy, proposer):
    built = make_engine(proposer, gamma=4)
    prompts = prompt_ids[:4]
    assert len({len(p) for p in prompts}) == 4
    results = built.engine.generate([GenerationRequest(p, MAX_NEW) for p in prompts])
    assert [r.token_ids for r in results] == [hf_greedy(p, MAX_NEW) for p in prompts]
    assert built.engine.stats.accepted > 0


def test_requests_beyond_the_slot_count_wait_and_still_match(make_engine, prompt_ids, hf_greedy):
    built = make_engine("draft", gamma=3, num_slots=2)
    prompts = prompt_ids[:5]
    results = built.engine.generate([GenerationRequest(p, 24) for p in prompts])
    assert [r.token_ids for r in results] == [hf_greedy(p, 24) for p in prompts]
    assert built.engine.verifier.num_free_slots == 2


def test_rows_with_their_own_gamma_share_a_round(make_engine, prompt_ids, hf_greedy):
    built = make_engine("draft", gamma=4)
    requests = [GenerationRequest(p, 32, gamma=g) for p, g in zip(prompt_ids[:3], [0, 2, None])]
    results = built.engine.generate(requests)
    assert [r.token_ids for r in results] == [hf_greedy(p, 32) for p in prompt_ids[:3]]
    assert results[0].stats.drafted == 0 and results[0].stats.mean_accepted_length == 1.0
    assert results[1].stats.drafted > 0
