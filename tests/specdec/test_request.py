"""Bad input is rejected with an error that names the field."""

import pytest

from specdec.request import GenerationRequest
from specdec.sampling_params import SamplingParams


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"temperature": -0.5}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -1}, "top_k"),
        ({"seed": -3}, "seed"),
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
        request.check_limits(vocab_size=256, max_seq_len=64, max_new_tokens_limit=4096)


def test_a_fitting_request_passes():
    GenerationRequest([1, 2, 3], max_new_tokens=61).check_limits(256, 64, 4096)
