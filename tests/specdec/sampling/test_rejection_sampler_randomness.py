"""Specification of specdec.sampling.rejection_sampler: which random numbers a round draws, so
that each row of a mixed batch gets what it gets alone and a seeded row's output depends on its
own inputs, seed and position only (what a round emits: test_rejection_sampler_outcomes.py).
"""

from __future__ import annotations

import dataclasses

import torch

from specdec.sampling.counter_rng import ROLE_ACCEPT, ROLE_FINAL
from specdec.sampling.rejection_sampler import rejection_sample
from specdec.sampling.sampling import SamplingBatch, inverse_cdf_sample, logits_to_probs
from specdec.sampling.sampling_params import SamplingParams
from rejection_rounds import GREEDY, SAMPLED, VOCAB, addressed, one_hot_logits, padded_drafts, random_round
from sampling_rules import standard_rule

# --- mixed batches and addressed randomness ----------------------------------------------
#
# Row b's acceptance test of drafted token i uses the uniform (seed_b, positions_b + i,
# ROLE_ACCEPT); its recovered-or-bonus token uses (seed_b, positions_b + num_accepted_b,
# ROLE_FINAL). So a seeded row's output depends on its own inputs, seed and position only.


def _seeded(params: SamplingParams, seed: int) -> SamplingParams:
    return dataclasses.replace(params, seed=seed)


def _solo(target_logits, ids, num_drafted, q, params, position=0):
    """Verify one row alone."""
    return rejection_sample(target_logits, ids, num_drafted, q, SamplingBatch.from_params([params], [position]))


def test_the_acceptance_and_final_draws_use_the_addressed_uniforms():
    """Replays the algorithm with the documented uniforms and checks every row's outcome."""
    rows, gamma = 400, 3
    params = [SamplingParams(temperature=1.0, seed=1000 + r) for r in range(rows)]
    target_logits, ids, num_drafted, q = random_round(rows, gamma, VOCAB, seed=20, params=params)
    batch = standard_rule(SamplingBatch.from_params(params, [r % 17 for r in range(rows)]))
    out = rejection_sample(target_logits, ids, num_drafted, q, batch)
    p = logits_to_probs(target_logits, batch)  # [B, gamma + 1, V]
    u_accept = addressed(batch, torch.arange(gamma).expand(rows, gamma), ROLE_ACCEPT)  # [B, gamma]
    p_x, q_x = p[:, :gamma].gather(-1, ids[..., None])[..., 0], q.gather(-1, ids[..., None])[..., 0]
    expected_accepted = (u_accept * q_x < p_x).long().cumprod(-1).sum(-1)
    assert torch.equal(out.num_accepted, expected_accepted)
    u_final = addressed(batch, expected_accepted, ROLE_FINAL)  # [B]
    for r, emitted in enumerate(out.emitted()):
        n = int(expected_accepted[r])
        final_probs = p[r, n] if n == gamma else (p[r, n] - q[r, n]).clamp(min=0)  # bonus or residual
        final = inverse_cdf_sample(final_probs[None], u_final[r : r + 1])
        assert emitted == ids[r, :n].tolist() + final.tolist()


def test_mixed_batch_gives_each_row_what_it_gets_alone():
    params = [GREEDY, SamplingParams(temperature=0.8, seed=1), GREEDY, SamplingParams(temperature=1.2, top_k=4, seed=2)]
    target_logits, ids, _, q = random_round(4, 3, VOCAB, seed=11, params=params)
    num_drafted = torch.tensor([3, 2, 1, 3])
    positions = [5, 6, 7, 8]
    together = rejection_sample(target_logits, ids, num_drafted, q, SamplingBatch.from_params(params, positions))
    for r, p in enumerate(params):
        one = slice(r, r + 1)
        alone = _solo(target_logits[one], ids[one], num_drafted[one], q[one], p, positions[r])
        assert together.emitted()[r] == alone.emitted()[0]


def test_mixed_batch_with_one_hot_targets_gives_the_same_tokens_on_both_paths():
    target_logits = one_hot_logits([[1, 2, 3]] * 4)
    ids, num_drafted = padded_drafts([[1, 2], [1, 6], [1, 2], [1, 6]], 2)
    batch = SamplingBatch.from_params([GREEDY, GREEDY, SAMPLED, SAMPLED])
    out = rejection_sample(target_logits, ids, num_drafted, torch.full((4, 2, VOCAB), 1 / VOCAB), batch)
    assert out.emitted() == [[1, 2, 3], [1, 2], [1, 2, 3], [1, 2]]


def test_same_seed_and_positions_give_the_same_output():
    params = [SamplingParams(temperature=1.0, seed=s) for s in range(300)]
    target_logits, ids, num_drafted, q = random_round(300, 4, VOCAB, seed=12, params=params)
    positions = list(range(300))
    first = rejection_sample(target_logits, ids, num_drafted, q, SamplingBatch.from_params(params, positions))
    second = rejection_sample(target_logits, ids, num_drafted, q, SamplingBatch.from_params(params, positions))
    assert torch.equal(first.output_token_ids, second.output_token_ids)


def test_different_seeds_give_different_outputs():
    target_logits, ids, num_drafted, q = random_round(1, 4, VOCAB, seed=13, params=[SAMPLED])
    outputs = [_solo(target_logits, ids, num_drafted, q, _seeded(SAMPLED, seed)).emitted()[0] for seed in range(50)]
    assert len({tuple(o) for o in outputs}) > 1


def test_the_same_round_at_other_positions_draws_new_numbers():
    """Positions address the uniforms: replaying a round at the same position repeats it,
    at later positions (the next rounds of a sequence) it does not."""
    target_logits, ids, num_drafted, q = random_round(1, 3, VOCAB, seed=17, params=[SAMPLED])
    params = _seeded(SAMPLED, 5)
    by_position = [_solo(target_logits, ids, num_drafted, q, params, t).emitted()[0] for t in range(30)]
    again = [_solo(target_logits, ids, num_drafted, q, params, t).emitted()[0] for t in range(30)]
    assert by_position == again
    assert len({tuple(r) for r in by_position}) > 1


def test_a_seeded_rows_output_does_not_depend_on_its_batch_gamma_or_row_order():
    params = SamplingParams(temperature=0.9, top_p=0.95)
    target_logits, ids, num_drafted, q = random_round(1, 2, VOCAB, seed=14, params=[params])
    # Three other rows join, everything is padded to a gamma of 5, and the row moves to the end.
    others = [SAMPLED, GREEDY, SamplingParams(temperature=1.0, seed=99)]
    big_logits, big_ids, _, big_q = random_round(4, 5, VOCAB, seed=15, params=[params, *others])
    big_logits[3, :3], big_ids[3, :2], big_q[3, :2] = target_logits[0], ids[0], q[0]
    big_num_drafted = torch.tensor([5, 4, 3, 2])
    for seed in range(20):
        mine = _seeded(params, seed)
        alone = _solo(target_logits, ids, num_drafted, q, mine, 40)
        joined_batch = SamplingBatch.from_params([*others, mine], [40, 40, 0, 40])
        joined = rejection_sample(big_logits, big_ids, big_num_drafted, big_q, joined_batch)
        assert joined.emitted()[3] == alone.emitted()[0]
