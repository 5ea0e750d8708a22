"""Per-position logits processing: logit_bias, penalties and min_p, at every drafted position.

Each position is processed over the tokens before it - the history, then the drafted tokens
that precede it - exactly as plain decoding would process it; transformers' own processors
(RepetitionPenaltyLogitsProcessor, MinPLogitsWarper) are the reference where they exist,
OpenAI's definition for the frequency and presence penalties.
"""

from __future__ import annotations

import pytest
import torch
from transformers import MinPLogitsWarper, RepetitionPenaltyLogitsProcessor

from specdec.sampling.logits_processors import RowProcessing, process_logits, row_processing
from specdec.sampling.rejection_sampler import rejection_sample
from specdec.sampling.sampling import SamplingBatch, logits_to_probs
from specdec.sampling.sampling_params import SamplingParams

VOCAB = 12


def _logits(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_neutral_params_need_no_processing_and_leave_the_logits_untouched():
    assert row_processing(SamplingParams(temperature=0.7, min_p=0.1), [1, 2], 1) is None
    logits = _logits(2, 3, VOCAB)
    assert process_logits(logits, [None, None], torch.zeros(2, 2, dtype=torch.long)) is logits


def test_repetition_penalty_equals_transformers_over_prompt_and_output():
    history = [3, 5, 5, 7, 11]
    logits = _logits(1, 1, VOCAB) * 3
    row = RowProcessing(SamplingParams(repetition_penalty=1.7), history, num_prompt_tokens=2)
    expected = RepetitionPenaltyLogitsProcessor(1.7)(torch.tensor([history]), logits[:, 0].clone())
    assert torch.allclose(process_logits(logits, [row])[:, 0], expected)


def test_frequency_and_presence_penalties_count_only_the_output():
    history = [4, 4, 9, 4, 2, 2]  # prompt [4, 4, 9], output [4, 2, 2]
    logits = _logits(1, 1, VOCAB)
    row = RowProcessing(SamplingParams(frequency_penalty=0.5, presence_penalty=1.25), history, 3)
    expected = logits[0, 0].clone()
    expected[4] -= 0.5 * 1 + 1.25
    expected[2] -= 0.5 * 2 + 1.25  # token 9 occurs only in the prompt: not penalised
    assert torch.allclose(process_logits(logits, [row])[0, 0], expected)


def test_logit_bias_is_added_and_ids_beyond_the_vocabulary_are_ignored():
    params = SamplingParams(logit_bias={1: 100.0, 6: -2.5, VOCAB + 3: 50.0})
    logits = _logits(1, 1, VOCAB)
    expected = logits[0, 0].clone()
    expected[1] += 100.0
    expected[6] -= 2.5
    assert torch.allclose(process_logits(logits, [row_processing(params, [0], 1)])[0, 0], expected)


def test_each_drafted_position_sees_the_drafts_before_it_and_no_others():
    params = SamplingParams(repetition_penalty=1.3, frequency_penalty=0.4, presence_penalty=0.3, logit_bias={2: 1.0})
    history, drafts = [1, 2, 3, 3], torch.tensor([[3, 8, 8, 0]])
    logits = _logits(1, 4, VOCAB, seed=1)
    together = process_logits(logits, [RowProcessing(params, history, 2)], drafts)  # [1, 4, V]
    for i in range(4):
        alone = RowProcessing(params, history + drafts[0, :i].tolist(), 2)
        assert torch.allclose(together[0, i], process_logits(logits[:, i : i + 1], [alone])[0, 0])


def test_min_p_keeps_what_transformers_keeps_after_temperature():
    logits = _logits(3, VOCAB, seed=2) * 2
    batch = SamplingBatch.from_params([SamplingParams(temperature=0.8, min_p=0.2)] * 3)
    reference = MinPLogitsWarper(0.2)(None, logits / 0.8)
    assert torch.allclose(logits_to_probs(logits, batch), torch.softmax(reference, dim=-1))


def test_a_greedy_row_verifies_against_the_processed_argmax_at_every_position():
    logits = torch.zeros(1, 3, VOCAB, dtype=torch.float64)
    logits[0, :, 5] = 2.0  # the raw argmax everywhere
    logits[0, :, 6] = 1.0
    params = SamplingParams(presence_penalty=1.5)  # a token once emitted drops below token 6
    batch = SamplingBatch.from_params([params], [4], histories=[[0, 1, 2, 3]], num_prompt_tokens=[4])
    out = rejection_sample(logits, torch.tensor([[5, 5]]), torch.tensor([2]), None, batch)
    assert out.emitted() == [[5, 6]]  # 5 accepted, then the processed argmax rejects the second 5


def test_processing_is_applied_to_the_rows_that_ask_for_it_alone():
    logits = _logits(2, 2, VOCAB, seed=3)
    rows = [None, RowProcessing(SamplingParams(frequency_penalty=2.0), [1, 4], 1)]
    out = process_logits(logits, rows, torch.tensor([[7], [4]]))
    assert torch.equal(out[0], logits[0])
    assert out[1, 1, 4] == pytest.approx(float(logits[1, 1, 4]) - 4.0)  # 4 once in the output, once drafted


@pytest.mark.parametrize(
    "field, value",
    [("min_p", 1.5), ("presence_penalty", -2.5), ("frequency_penalty", 2.5), ("repetition_penalty", 0.0),
     ("repetition_penalty", float("inf")), ("logit_bias", {1: 101.0}), ("logit_bias", {-1: 1.0}),
     ("logit_bias", {i: 1.0 for i in range(301)}), ("logit_bias", "x")],
)
def test_out_of_range_processing_params_are_refused_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})
