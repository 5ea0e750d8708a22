"""The public API's translation: GenerateRequest -> GenerationRequest (bad input names the
field), results -> GenerateResponse, round outputs -> chunks (their text is the engine's:
held back and stop-cut by specdec.requests.stop_conditions, whose tests cover it)."""

import pytest

from specdec.round.round_output import GenerationResult, RoundOutput
from specdec.requests.stats import SpecStats
from specdec_rpc.public.public_api import (ServerDefaults, prompt_char_limit, to_chunk, to_generation_request,
                                           to_response)
from specdec_rpc.v1 import specdec_pb2 as pb

DEFAULTS = ServerDefaults(max_new_tokens=32, gamma=4, proposers=("draft", "ngram"), max_prompt_chars=100)


def encode(text: str) -> list[int]:
    return [ord(c) for c in text]


def decode(ids: list[int]) -> str:
    return "".join(chr(i) for i in ids)


def translate(**fields):
    return to_generation_request(pb.GenerateRequest(**fields), encode, DEFAULTS)


def test_a_text_prompt_is_tokenised_and_defaults_are_filled_in():
    request = translate(prompt="abc")
    assert request.prompt_token_ids == (97, 98, 99)
    assert request.max_new_tokens == 32 and request.proposer is None
    assert (request.mode, request.gamma) == ("auto", None), "the engine resolves γ per round"
    assert request.sampling.is_greedy and request.sampling.top_p == 1.0 and request.sampling.seed is None


def test_token_ids_sampling_stop_and_budget_are_taken_as_given():
    request = translate(
        prompt_token_ids=[5, 6],
        max_new_tokens=7,
        sampling=pb.SamplingParams(temperature=0.5, top_k=3, top_p=0.5, seed=9),
        stop=["\n\n"],
    )
    assert request.prompt_token_ids == (5, 6) and request.max_new_tokens == 7 and request.stop == ("\n\n",)
    assert (request.sampling.temperature, request.sampling.top_k, request.sampling.top_p, request.sampling.seed) == (
        0.5, 3, 0.5, 9,
    )


def test_min_p_penalties_and_logit_bias_are_taken_as_given():
    sampling = pb.SamplingParams(temperature=0.5, min_p=0.25, presence_penalty=0.5, frequency_penalty=-1.5,
                                 repetition_penalty=1.25, logit_bias={7: -100.0, 3: 2.5})
    got = translate(prompt_token_ids=[5], sampling=sampling).sampling
    assert (got.min_p, got.presence_penalty, got.frequency_penalty, got.repetition_penalty) == (0.25, 0.5, -1.5, 1.25)
    assert got.logit_bias == ((3, 2.5), (7, -100.0))
    assert translate(prompt_token_ids=[5]).sampling.repetition_penalty == 1.0  # unset = off


@pytest.mark.parametrize(
    "speculation, mode, gamma, proposer",
    [
        (pb.SpeculationParams(mode=pb.SPECULATION_MODE_OFF, gamma=6), "off", 6, None),
        (pb.SpeculationParams(mode=pb.SPECULATION_MODE_ON), "on", None, None),
        (pb.SpeculationParams(mode=pb.SPECULATION_MODE_ON, gamma=6, proposer=pb.PROPOSER_KIND_NGRAM), "on", 6, "ngram"),
        (pb.SpeculationParams(mode=pb.SPECULATION_MODE_AUTO, proposer=pb.PROPOSER_KIND_DRAFT), "auto", None, "draft"),
    ],
)
def test_speculation_settings_travel_to_the_engine(speculation, mode, gamma, proposer):
    request = translate(prompt="x", speculation=speculation)
    assert (request.mode, request.gamma, request.proposer) == (mode, gamma, proposer)


@pytest.mark.parametrize(
    "fields, field",
    [
        ({}, "prompt"),
        ({"prompt": "x", "prompt_token_ids": [1]}, "prompt"),
        ({"prompt": "x", "max_new_tokens": -1}, "max_new_tokens"),
        ({"prompt": "x", "sampling": pb.SamplingParams(temperature=-0.5)}, "temperature"),
        ({"prompt": "x", "sampling": pb.SamplingParams(top_p=0.0)}, "top_p"),
        ({"prompt": "x", "sampling": pb.SamplingParams(top_p=1.5)}, "top_p"),
        ({"prompt": "x", "sampling": pb.SamplingParams(top_k=-1)}, "top_k"),
        ({"prompt": "x", "sampling": pb.SamplingParams(temperature=float("inf"))}, "temperature"),
        ({"prompt": "x", "sampling": pb.SamplingParams(temperature=float("nan"))}, "temperature"),
        ({"prompt": "x", "sampling": pb.SamplingParams(top_p=float("nan"))}, "top_p"),
        ({"prompt": "x", "speculation": pb.SpeculationParams(gamma=-1)}, "gamma"),
        ({"prompt": "x", "speculation": pb.SpeculationParams(mode=pb.SPECULATION_MODE_OFF, gamma=-1)}, "gamma"),
        ({"prompt": "x", "speculation": pb.SpeculationParams(mode=7)}, "speculation.mode"),
        ({"prompt": "x", "stop": [""]}, "stop"),
    ],
)
def test_bad_input_raises_value_error_naming_the_field(fields, field):
    with pytest.raises(ValueError, match=field):
        translate(**fields)


def test_a_proposer_the_server_lacks_is_rejected():
    message = pb.GenerateRequest(prompt="x", speculation=pb.SpeculationParams(proposer=pb.PROPOSER_KIND_DRAFT))
    with pytest.raises(ValueError, match="speculation.proposer"):
        to_generation_request(message, encode, ServerDefaults(32, 4, proposers=("ngram",)))


def result(text: str, token_ids: list[int], reason: str = "length") -> GenerationResult:
    stats = SpecStats(rounds=4, drafted=12, accepted=6, emitted=len(token_ids), gamma=3)
    return GenerationResult("seq-0", token_ids, text, reason, stats)


def test_a_result_becomes_a_response_with_stats():
    response = to_response(result("hi", [104, 105]))
    assert (response.text, list(response.token_ids), response.finish_reason) == ("hi", [104, 105], "length")
    s = response.stats
    assert (s.rounds, s.drafted, s.accepted, s.gamma, s.speculation_enabled) == (4, 12, 6, 3, True)
    assert s.acceptance_rate == pytest.approx(0.5) and s.mean_accepted_length == pytest.approx(2.5)
    plain = result("hi", [104, 105])
    plain.stats.gamma = 0
    assert not to_response(plain).stats.speculation_enabled


def test_a_round_becomes_a_chunk_and_the_last_one_carries_the_outcome():
    chunk = to_chunk(RoundOutput("seq-0", [100, 101], None, text="de"))
    assert (chunk.text, list(chunk.token_ids), chunk.finish_reason) == ("de", [100, 101], "")
    assert not chunk.HasField("stats")
    last = to_chunk(RoundOutput("seq-0", [102], "length", text="f"), result("def", encode("def")))
    assert (last.text, last.finish_reason, last.stats.rounds) == ("f", "length", 4)


def test_seeds_are_any_uint64_and_stop_token_ids_travel():
    request = translate(prompt="x", sampling=pb.SamplingParams(temperature=1.0, seed=2**64 - 1), stop_token_ids=[7, 9])
    assert request.sampling.seed == 2**64 - 1 and request.stop_token_ids == (7, 9)


def test_an_over_long_prompt_is_refused_before_it_is_tokenised():
    calls = []

    def counting_encode(text):
        calls.append(text)
        return encode(text)

    with pytest.raises(ValueError, match="prompt: 101 characters cannot fit the context"):
        to_generation_request(pb.GenerateRequest(prompt="y" * 101), counting_encode, DEFAULTS)
    assert calls == []
    request = to_generation_request(pb.GenerateRequest(prompt="y" * 100), counting_encode, DEFAULTS)
    assert len(request.prompt_token_ids) == 100


def test_the_prompt_character_bound_follows_the_longest_token(tokenizer):
    """No text of more characters than the bound fits the context, whatever it says."""
    limit = prompt_char_limit(64, tokenizer)
    longest = max(len(t) for t in tokenizer.get_vocab())
    assert limit == 2 * 64 * longest
    for text in ("    " * 5000, "x" * 20000, "é" * 20000, "def f(x):\n" * 2000):
        if len(text) > limit:
            assert len(tokenizer(text, add_special_tokens=False)["input_ids"]) > 64


def test_a_tpot_target_travels_to_the_engine_and_unset_means_the_servers():
    assert translate(prompt="x").tpot_target_ms is None
    assert translate(prompt="x", speculation=pb.SpeculationParams(tpot_target_ms=25.5)).tpot_target_ms == 25.5


@pytest.mark.parametrize("target", [0.0, -5.0, float("nan"), float("inf")])
def test_a_tpot_target_that_is_not_positive_and_finite_is_invalid_naming_the_field(target):
    with pytest.raises(ValueError, match="speculation.tpot_target_ms"):
        translate(prompt="x", speculation=pb.SpeculationParams(tpot_target_ms=target))


def test_logprobs_are_asked_for_with_their_alternatives_and_returned_per_token():
    from specdec.sampling.token_logprobs import TokenLogprob

    assert translate(prompt="x", logprobs=3).logprobs == 3 and translate(prompt="x", logprobs=0).logprobs == 0
    assert translate(prompt="x").logprobs is None
    with pytest.raises(ValueError, match="logprobs"):
        translate(prompt="x", logprobs=21)
    tokens = [TokenLogprob(104, -0.25, ((104, -0.25), (7, -2.0))), TokenLogprob(105, -1.5, ())]
    done = result("hi", [104, 105])
    done.logprobs = tokens
    [first, second] = to_response(done).logprobs
    assert (first.token_id, first.logprob, list(first.top_token_ids), list(first.top_logprobs)) == (
        104, -0.25, [104, 7], [-0.25, -2.0])
    assert (second.token_id, second.logprob, list(second.top_token_ids)) == (105, -1.5, [])
    chunk = to_chunk(RoundOutput("seq-0", [104], None, text="h", logprobs=tokens[:1]))
    assert [t.token_id for t in chunk.logprobs] == [104] and not to_response(result("hi", [104, 105])).logprobs


def test_prompt_logprobs_are_asked_for_and_returned_without_the_first_token():
    from specdec.sampling.token_logprobs import TokenLogprob

    assert translate(prompt="x", prompt_logprobs=2).prompt_logprobs == 2
    assert translate(prompt="x").prompt_logprobs is None
    with pytest.raises(ValueError, match="prompt_logprobs"):
        translate(prompt="x", prompt_logprobs=21)
    scored = [None, TokenLogprob(9, -3.0, ((4, -0.5),))]
    done = result("hi", [104])
    done.prompt_logprobs = scored
    [only] = to_response(done).prompt_logprobs
    assert (only.token_id, only.logprob, list(only.top_token_ids)) == (9, -3.0, [4])
    chunk = to_chunk(RoundOutput("seq-0", [104], None, text="h", prompt_logprobs=scored))
    assert [t.token_id for t in chunk.prompt_logprobs] == [9] and not to_response(result("hi", [104])).prompt_logprobs
