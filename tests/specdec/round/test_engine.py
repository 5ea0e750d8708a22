"""The engine's round loop: stop conditions, statistics, seeds, cancellation and slot hygiene."""

import pytest

from specdec.requests.request import GenerationRequest
from specdec.sampling.sampling_params import SamplingParams


@pytest.fixture(scope="module")
def draft_engine(make_engine):
    return make_engine("draft", gamma=4)


def test_max_new_tokens_is_exact_even_when_a_round_overshoots(draft_engine, prompt_ids):
    [r] = draft_engine.engine.generate([GenerationRequest(prompt_ids[0], 7, ignore_eos=True)])
    assert len(r.token_ids) == 7 and r.finish_reason == "length"


def test_stats_follow_the_definitions(draft_engine, prompt_ids):
    [r] = draft_engine.engine.generate([GenerationRequest(prompt_ids[1], 40, ignore_eos=True)])
    s = r.stats
    assert s.rounds > 0 and s.drafted > 0
    assert s.acceptance_rate == pytest.approx(s.accepted / s.drafted)
    assert s.mean_accepted_length == pytest.approx((s.accepted + s.rounds) / s.rounds)
    # every round emits accepted + 1 tokens; only the last round may be cut by max_new_tokens
    assert s.emitted == len(r.token_ids) == 40
    assert s.accepted + s.rounds >= 40 > s.accepted + s.rounds - 5
    assert sum(s.accepted_per_position) == s.accepted
    assert s.drafted_per_position[0] <= s.rounds


def test_same_seed_same_sampled_output(make_engine, prompt_ids):
    params = SamplingParams(temperature=0.8, top_p=0.95, seed=1234)
    outputs = []
    for _ in range(2):
        built = make_engine("draft", gamma=4)
        [r] = built.engine.generate([GenerationRequest(prompt_ids[0], 32, params, ignore_eos=True)])
        outputs.append(r.token_ids)
    assert outputs[0] == outputs[1]
    built = make_engine("draft", gamma=4)
    other = SamplingParams(temperature=0.8, top_p=0.95, seed=99)
    [r] = built.engine.generate([GenerationRequest(prompt_ids[0], 32, other, ignore_eos=True)])
    assert r.token_ids != outputs[0]


def test_mixed_batch_of_greedy_and_sampled_requests(draft_engine, prompt_ids, hf_greedy):
    requests = [
        GenerationRequest(prompt_ids[0], 24),
        GenerationRequest(prompt_ids[1], 24, SamplingParams(temperature=1.0, top_k=20, seed=7), ignore_eos=True),
    ]
    greedy, sampled = draft_engine.engine.generate(requests)
    assert greedy.token_ids == hf_greedy(prompt_ids[0], 24)
    assert len(sampled.token_ids) == 24


@pytest.mark.parametrize("field", ["stop", "server_stop"])  # the server's own stop strings end it alike
def test_stop_string_cuts_the_text(draft_engine, tokenizer, prompt_ids, hf_greedy, field):
    expected = tokenizer.decode(hf_greedy(prompt_ids[0], 48), skip_special_tokens=True)
    stop = expected[10:14]
    assert stop.strip(), "the greedy continuation should have text to stop on"
    [r] = draft_engine.engine.generate([GenerationRequest(prompt_ids[0], 48, **{field: (stop,)})])
    assert r.finish_reason == "stop"
    assert r.text == expected[: expected.find(stop)]
    assert stop not in r.text


def test_abort_frees_target_and_draft_slots(draft_engine, prompt_ids):
    engine = draft_engine.engine
    draft_runner = engine.proposer.proposers["draft"].runner
    free_target, free_draft = engine.verifier.num_free_slots, draft_runner.num_free_slots
    seq_id = engine.add_request(GenerationRequest(prompt_ids[0], 64))
    engine.step()
    engine.step()
    assert engine.verifier.num_free_slots == free_target - 1
    assert draft_runner.num_free_slots == free_draft - 1
    engine.abort(seq_id)
    assert (engine.verifier.num_free_slots, draft_runner.num_free_slots) == (free_target, free_draft)
    assert not engine.has_unfinished()
    assert engine.result(seq_id).finish_reason == "abort"


def test_ngram_speculation_accepts_on_repetitive_input(make_engine, tokenizer):
    built = make_engine("ngram", gamma=4)
    prompt = tokenizer("for i in range(10):\n    print(i)\n" * 6, add_special_tokens=False)["input_ids"]
    [r] = built.engine.generate([GenerationRequest(prompt, 32, ignore_eos=True)])
    assert r.stats.drafted > 0 and r.stats.accepted > 0


def test_a_prompt_longer_than_the_context_is_rejected_naming_the_field(make_engine):
    built = make_engine("none", gamma=0, cache={"max_seq_len": 32})
    with pytest.raises(ValueError, match="prompt"):
        built.engine.add_request(GenerationRequest([5] * 40, 4))
    with pytest.raises(ValueError, match="max_new_tokens"):
        built.engine.add_request(GenerationRequest([5] * 10, 30))


def test_stats_report_the_policys_gamma_even_when_the_last_round_is_cut_short(draft_engine, prompt_ids):
    [r] = draft_engine.engine.generate([GenerationRequest(prompt_ids[2], 9, ignore_eos=True)])
    assert r.stats.gamma == 4


def test_queue_time_counts_the_rounds_a_request_waited_for_a_slot(make_engine, prompt_ids):
    """Two slots, three requests: the third waits for a slot; the first two start at once."""
    built = make_engine("ngram", gamma=2, num_slots=2)
    results = built.engine.generate([GenerationRequest(p, 12) for p in prompt_ids[:3]])
    first, second, third = (r.queue_s for r in results)
    assert 0 <= first < third and 0 <= second < third
    assert third > 0.0
