"""A request's choices: n per prompt in OpenAI's index order, sample 0 under the request's
own seed and the others under seeds derived from it (reproducible, distinct), prompt
logprobs asked for once per prompt (on every sample of a request that only scores)."""

from specdec.sampling.sampling_params import SamplingParams
from specdec.serving.fan_out import choice_requests, choice_seed
from specdec.serving.text_request import TextRequest


def test_sample_0_keeps_the_seed_and_the_others_derive_distinct_reproducible_ones():
    assert choice_seed(7, 0) == 7 and choice_seed(None, 3) is None
    derived = [choice_seed(7, j) for j in range(1, 50)]
    assert derived == [choice_seed(7, j) for j in range(1, 50)] and len(set(derived + [7])) == 50
    assert all(0 <= s < 2**64 for s in derived) and choice_seed(8, 1) != choice_seed(7, 1)


def test_choices_are_n_per_prompt_in_index_order_with_prompt_logprobs_once_per_prompt():
    prompts = [TextRequest(prompt=p, sampling=SamplingParams(temperature=1.0, seed=5), prompt_logprobs=2)
               for p in ("a", "b")]
    choices = choice_requests(prompts, 3)
    assert [c.prompt for c in choices] == ["a"] * 3 + ["b"] * 3
    assert [c.sampling.seed for c in choices] == [choice_seed(5, j) for j in range(3)] * 2
    assert [c.prompt_logprobs for c in choices] == [2, None, None] * 2
    scoring = choice_requests([TextRequest(prompt="a", max_new_tokens=0, prompt_logprobs=0)], 2)
    assert [c.prompt_logprobs for c in scoring] == [0, 0] and all(c.scores_only for c in scoring)
