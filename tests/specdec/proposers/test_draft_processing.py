"""The draft processes its logits like the target (penalties and bias over the tokens before
each position, its own earlier guesses included) and reports the q it drew from."""

import pytest
import torch

from draft_logits import raw_logits
from specdec.models.model_paths import resolve_model_path
from specdec.models.model_runner import ModelRunner
from specdec.proposers.base import ProposalRequest
from specdec.proposers.draft_proposer import DraftModelProposer
from specdec.sampling.sampling_params import SamplingParams


@pytest.fixture(scope="module")
def runner():
    return ModelRunner.from_pretrained(resolve_model_path("bundled:draft"), num_slots=2, max_seq_len=512)


def test_q_at_each_position_is_the_processed_draft_distribution_after_the_guesses_before_it(runner, prompt_ids):
    prompt, output = prompt_ids[0][:20], prompt_ids[0][20:26]
    history = prompt + output
    params = SamplingParams(temperature=0.8, presence_penalty=1.5, frequency_penalty=0.5, logit_bias={13: 3.0})
    proposer = DraftModelProposer(runner, runner.vocab_size)
    proposal = proposer.propose([ProposalRequest("s", history, params, gamma=3, num_prompt_tokens=len(prompt))])
    guesses = proposal[0].token_ids
    raw = raw_logits(runner, history + guesses[:-1])[len(history) - 1 :]  # [3, V]: after history + guesses[:i]
    for i in range(3):
        seen = output + guesses[:i]
        x = raw[i].clone()
        x[13] += 3.0
        count = torch.bincount(torch.tensor(seen), minlength=x.numel()).double()
        x -= 0.5 * count + 1.5 * (count > 0).double()
        expected = torch.softmax(x / 0.8, dim=-1)
        assert torch.allclose(proposal[0].q[i].double(), expected, atol=1e-5), f"position {i + 1}"
    proposer.release("s")
