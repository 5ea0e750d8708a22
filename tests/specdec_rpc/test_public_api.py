"""The public API's translation: GenerateRequest -> GenerationRequest (bad input names the
field), results -> GenerateResponse, round outputs -> chunks whose texts add up to the result."""

import pytest

from specdec.engine import GenerationResult
from specdec.stats import SpecStats
from specdec_rpc.public_api import ChunkBuilder, ServerDefaults, to_generation_request, to_response
from specdec_rpc.v1 import specdec_pb2 as pb

DEFAULTS = ServerDefaults(max_new_tokens=32, gamma=4, proposers=("draft", "ngram"))


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
        ({"prompt": "x", "sampling": pb.SamplingParams(seed=2**64 - 1)}, "seed"),
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


def test_chunk_texts_add_up_to_the_final_text():
    builder = ChunkBuilder(decode)
    texts = [builder.chunk(encode(part)).text for part in ("def ", "f(x)", ":")]
    last = builder.last_chunk(encode("\n"), result("def f(x):\n", encode("def f(x):\n")))
    assert texts == ["def ", "f(x)", ":"] and last.text == "\n"
    assert last.finish_reason == "length" and last.stats.rounds == 4


def test_an_incomplete_character_is_held_back():
    def partial_decode(ids):  # 0 stands for the first byte of a two-byte character
        text = decode([i for i in ids if i])
        return text + "\ufffd" if ids[-1] == 0 else text.replace("\x01", "é")

    builder = ChunkBuilder(partial_decode)
    assert builder.chunk([97, 0]).text == "a"
    assert builder.chunk([1]).text == "é"


def test_text_that_may_start_a_stop_string_is_held_back_and_the_stop_is_cut():
    builder = ChunkBuilder(decode, stop=("END",))
    assert builder.chunk(encode("abc E")).text == "abc "
    assert builder.chunk(encode("x")).text == "Ex"
    assert builder.chunk(encode(" EN")).text == " "
    final = result("abc Ex ", encode("abc Ex END"), reason="stop")
    assert builder.last_chunk(encode("D"), final).text == ""
