"""Bad input is rejected with an error that names the field."""

import pytest

from specdec.requests.request import GenerationRequest, RequestLimits
from specdec.sampling.sampling_params import SamplingParams

LIMITS = RequestLimits(vocab_size=256, max_seq_len=64, max_new_tokens_limit=4096, gamma_limit=8,
                       max_stop_strings=4, max_stop_string_chars=10, proposers=("ngram",))


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"temperature": -0.5}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -1}, "top_k"),
        ({"seed": -3}, "seed"),
        ({"seed": 2**64}, "seed"),
        ({"temperature": float("inf")}, "temperature"),
        ({"temperature": float("-inf")}, "temperature"),
        ({"top_p": float("nan")}, "top_p"),
        ({"top_p": float("inf")}, "top_p"),
        ({"top_k": 1.5}, "top_k"),
    ],
)
def test_bad_sampling_params_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"prompt_token_ids": []}, "prompt"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"max_new_tokens": -5}, "max_new_tokens"),
        ({"gamma": -1}, "gamma"),
        ({"stop": ("",)}, "stop"),
        ({"mode": "sometimes"}, "speculation.mode"),
        ({"stop_token_ids": ["x"]}, "stop_token_ids"),
    ],
)
def test_bad_requests_name_the_field(kwargs, field):
    args = {"prompt_token_ids": [1, 2], **kwargs}
    with pytest.raises(ValueError, match=field):
        GenerationRequest(**args)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"max_new_tokens": 10_000}, "max_new_tokens"),
        ({"prompt_token_ids": [1] * 64}, "prompt"),
        ({"max_new_tokens": 40, "prompt_token_ids": [1] * 30}, "max_new_tokens"),
        ({"prompt_token_ids": [1, 500]}, "prompt_token_ids"),
    ],
)
def test_requests_that_do_not_fit_the_model_name_the_field(kwargs, field):
    request = GenerationRequest(**{"prompt_token_ids": [1, 2], "max_new_tokens": 8, **kwargs})
    with pytest.raises(ValueError, match=field):
        request.check_limits(LIMITS)


def test_a_fitting_request_passes():
    GenerationRequest([1, 2, 3], max_new_tokens=61, gamma=8, proposer="ngram", stop=("a",) * 4).check_limits(LIMITS)


def test_the_servers_own_stop_strings_do_not_count_against_the_clients_caps():
    # the caps bound what a client sends: a server that allows no stop strings (or exactly the
    # client's) still adds its own, however long
    caps = {**LIMITS.__dict__, "max_stop_strings": 0, "max_stop_string_chars": 1}
    GenerationRequest([1, 2], 8, server_stop=("</tool_call>",)).check_limits(RequestLimits(**caps))
    full = GenerationRequest([1, 2], 8, stop=("a",) * 4, server_stop=("</tool_call>",))
    full.check_limits(LIMITS)
    assert full.stop_strings == ("a",) * 4 + ("</tool_call>",)
    with pytest.raises(ValueError, match="stop: 5 stop strings exceed the limit 4"):
        GenerationRequest([1, 2], 8, stop=("a",) * 5, server_stop=("</tool_call>",)).check_limits(LIMITS)
    with pytest.raises(ValueError, match="stop"):
        GenerationRequest([1, 2], server_stop=("",))


def test_the_largest_seed_is_a_uint64():
    assert SamplingParams(temperature=1.0, seed=2**64 - 1).seed == 2**64 - 1
