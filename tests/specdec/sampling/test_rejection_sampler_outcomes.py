"""Specification of specdec.sampling.rejection_sampler: what one round of batched verification
emits, greedy and sampled, and which inputs it refuses.

Deterministic scenarios use targets whose processed distribution is one-hot at a chosen
token (all other logits -inf), so that greedy and sampled verification must agree on the
outcome. Which random numbers a round draws is in test_rejection_sampler_randomness.py,
distributional correctness in test_rejection_sampler_statistics.py.
"""

from __future__ import annotations

import time

import pytest
import torch

from specdec.sampling.counter_rng import ROLE_FINAL
from specdec.sampling.rejection_sampler import PAD_TOKEN_ID, RejectionOutput, rejection_sample
from specdec.sampling.sampling import SamplingBatch, inverse_cdf_sample, logits_to_probs
from specdec.sampling.sampling_params import SamplingParams
from rejection_rounds import GREEDY, SAMPLED, VOCAB, addressed, one_hot_logits, padded_drafts, random_round
from sampling_rules import standard_rule

# How the drafted tokens are verified: greedy, sampled against draft probabilities q, or
# sampled against an n-gram proposal without probabilities (one-hot q).
KINDS = ["greedy", "sampled", "ngram"]


def _verify(kind: str, targets: list[list[int]], drafts: list[list[int]], pad: int = PAD_TOKEN_ID) -> RejectionOutput:
    """Verify drafts against one-hot targets (targets[b] has gamma + 1 positions)."""
    target_logits = one_hot_logits(targets)  # [B, gamma + 1, V]
    batch, gamma = target_logits.shape[0], target_logits.shape[1] - 1
    ids, num_drafted = padded_drafts(drafts, gamma, pad)
    draft_probs = None if kind == "ngram" else torch.full((batch, gamma, VOCAB), 1.0 / VOCAB)
    params = GREEDY if kind == "greedy" else SAMPLED
    return rejection_sample(target_logits, ids, num_drafted, draft_probs, SamplingBatch.from_params([params] * batch))


# --- scenarios ---------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_perfect_match_accepts_every_drafted_token_and_adds_the_bonus_token(kind):
    out = _verify(kind, targets=[[1, 2, 3, 4]], drafts=[[1, 2, 3]])
    assert out.output_token_ids.tolist() == [[1, 2, 3, 4]]
    assert out.num_accepted.tolist() == [3]


@pytest.mark.parametrize("kind", KINDS)
def test_early_mismatch_emits_the_recovered_token_and_stops(kind):
    # d_2 is wrong; d_3 would match but comes after the rejection.
    out = _verify(kind, targets=[[1, 2, 3, 4]], drafts=[[1, 5, 3]])
    assert out.output_token_ids.tolist() == [[1, 2, PAD_TOKEN_ID, PAD_TOKEN_ID]]
    assert out.num_accepted.tolist() == [1]


@pytest.mark.parametrize("kind", KINDS)
def test_all_rejected_emits_only_the_recovered_token(kind):
    out = _verify(kind, targets=[[1, 2, 3, 4]], drafts=[[6, 2, 3]])
    assert out.output_token_ids.tolist() == [[1, PAD_TOKEN_ID, PAD_TOKEN_ID, PAD_TOKEN_ID]]
    assert out.num_accepted.tolist() == [0]


@pytest.mark.parametrize("kind", KINDS)
def test_no_proposals_gamma_zero_emits_exactly_one_token_from_the_target(kind):
    out = _verify(kind, targets=[[4], [2]], drafts=[[], []])
    assert out.output_token_ids.shape == (2, 1)
    assert out.output_token_ids.tolist() == [[4], [2]]
    assert out.num_accepted.tolist() == [0, 0]


@pytest.mark.parametrize("kind", KINDS)
def test_rows_with_different_num_drafted_take_the_bonus_token_from_their_own_position(kind):
    targets = [[1, 2, 3, 4]] * 4
    out = _verify(kind, targets, drafts=[[], [1], [1, 2, 3], [1, 2]])
    assert out.emitted() == [[1], [1, 2], [1, 2, 3, 4], [1, 2, 3]]
    assert out.num_accepted.tolist() == [0, 1, 3, 2]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("pad", [PAD_TOKEN_ID, 0, 3])
def test_padding_past_num_drafted_is_never_accepted(kind, pad):
    # The padding equals the target's token at position 3, yet only one token was drafted.
    out = _verify(kind, targets=[[1, 2, 3, 4]], drafts=[[1]], pad=pad)
    assert out.output_token_ids.tolist() == [[1, 2, PAD_TOKEN_ID, PAD_TOKEN_ID]]


@pytest.mark.parametrize("kind", KINDS)
def test_accepted_tokens_then_one_final_token_then_padding(kind):
    params = [GREEDY if kind == "greedy" else SAMPLED] * 2000
    target_logits, ids, _, q = random_round(2000, 4, VOCAB, seed=0, params=params)
    num_drafted = torch.randint(0, 5, (2000,), generator=torch.Generator().manual_seed(1))
    draft_probs = None if kind == "ngram" else q
    out = rejection_sample(target_logits, ids, num_drafted, draft_probs, SamplingBatch.from_params(params))
    tokens, accepted = out.output_token_ids, out.num_accepted
    assert tokens.shape == (2000, 5) and tokens.dtype == torch.int64 and accepted.dtype == torch.int64
    assert (accepted <= num_drafted).all()
    position = torch.arange(5)[None, :]
    is_accepted = position < accepted[:, None]
    assert torch.equal(tokens[:, :4][is_accepted[:, :4]], ids[is_accepted[:, :4]])
    assert (tokens.gather(1, accepted[:, None]) >= 0).all()
    assert (tokens[position > accepted[:, None]] == PAD_TOKEN_ID).all()


def test_emitted_lists_each_rows_tokens_without_padding():
    out = RejectionOutput(
        output_token_ids=torch.tensor([[5, 6, -1], [7, -1, -1], [1, 2, 3]]),
        num_accepted=torch.tensor([1, 0, 2]),
    )
    assert out.emitted() == [[5, 6], [7], [1, 2, 3]]


# --- greedy verification -----------------------------------------------------------------


def test_greedy_accepts_exactly_while_the_drafted_token_is_the_target_argmax():
    target_logits = torch.randn(500, 4, VOCAB, generator=torch.Generator().manual_seed(3))
    argmax = target_logits.argmax(-1)  # [B, 4]
    right = torch.rand(500, 3, generator=torch.Generator().manual_seed(4)) < 0.7
    ids = torch.where(right, argmax[:, :3], (argmax[:, :3] + 1) % VOCAB)
    out = rejection_sample(target_logits, ids, torch.full((500,), 3), None, SamplingBatch.from_params([GREEDY] * 500))
    expected_accepted = (ids == argmax[:, :3]).long().cumprod(-1).sum(-1)
    assert torch.equal(out.num_accepted, expected_accepted)
    final = out.output_token_ids.gather(1, expected_accepted[:, None]).squeeze(1)
    assert torch.equal(final, argmax.gather(1, expected_accepted[:, None]).squeeze(1))


def test_greedy_ignores_draft_probabilities():
    targets, drafts = [[1, 2, 3]], [[1, 2]]
    ids, num_drafted = padded_drafts(drafts, 2)
    q = torch.zeros(1, 2, VOCAB)
    q[..., 7] = 1.0  # claims the draft could only have proposed token 7
    out = rejection_sample(one_hot_logits(targets), ids, num_drafted, q, SamplingBatch.from_params([GREEDY]))
    assert out.emitted() == [[1, 2, 3]]


def test_greedy_rows_use_no_randomness():
    """A greedy row's outcome is the same whatever its seed and position, and verifying it
    touches no random generator."""
    target_logits, ids, num_drafted, q = random_round(4, 3, VOCAB, seed=5, params=[GREEDY] * 4)
    batches = [
        SamplingBatch.from_params([SamplingParams(seed=seed + r) for r in range(4)], [seed * 7] * 4)
        for seed in range(10)
    ]
    global_state = torch.get_rng_state()
    outputs = {tuple(map(tuple, rejection_sample(target_logits, ids, num_drafted, q, b).emitted())) for b in batches}
    assert torch.equal(torch.get_rng_state(), global_state)
    assert len(outputs) == 1


# --- sampled verification ----------------------------------------------------------------


def test_drafts_from_the_target_distribution_itself_are_always_accepted():
    params = [SamplingParams(temperature=0.9, top_k=5, top_p=0.9)] * 3000
    batch = SamplingBatch.from_params(params)
    target_logits = torch.randn(3000, 4, VOCAB, generator=torch.Generator().manual_seed(6))
    p = logits_to_probs(target_logits, batch)  # [B, 4, V]
    ids = torch.multinomial(p[:, :3].reshape(-1, VOCAB), 1).reshape(3000, 3)
    out = rejection_sample(target_logits, ids, torch.full((3000,), 3), p[:, :3], batch)
    assert (out.num_accepted == 3).all()


def test_ngram_draft_that_is_certain_under_the_target_is_always_accepted():
    out = _verify("ngram", targets=[[2, 2, 5]] * 100, drafts=[[2, 2]] * 100)
    assert (out.num_accepted == 2).all()


@pytest.mark.parametrize("kind", ["sampled", "ngram"])
def test_a_rejected_drafted_token_is_never_the_recovered_token(kind):
    params = [SamplingParams(temperature=1.0)] * 5000
    target_logits, ids, num_drafted, q = random_round(5000, 3, VOCAB, seed=7, params=params)
    draft_probs = None if kind == "ngram" else q
    out = rejection_sample(target_logits, ids, num_drafted, draft_probs, SamplingBatch.from_params(params))
    rejected = (out.num_accepted < num_drafted).nonzero().squeeze(-1)
    assert rejected.numel() > 1000
    position = out.num_accepted[rejected]
    assert (out.output_token_ids[rejected, position] != ids[rejected, position]).all()


def test_emitted_tokens_always_lie_in_the_processed_target_support():
    params = [SamplingParams(temperature=1.0, top_k=3), SamplingParams(temperature=0.7, top_p=0.5)] * 2000
    batch = SamplingBatch.from_params(params)
    target_logits, ids, num_drafted, q = random_round(4000, 3, VOCAB, seed=8, params=params)
    p = logits_to_probs(target_logits, batch)  # [B, 4, V]
    out = rejection_sample(target_logits, ids, num_drafted, q, batch)
    tokens = out.output_token_ids
    emitted = tokens >= 0
    support = p.gather(-1, tokens.clamp(min=0)[..., None]).squeeze(-1) > 0
    assert support[emitted].all()


def test_residual_without_mass_falls_back_to_the_target_distribution():
    """q = (1 - 1e-14) p + 1e-14 on a token the target rules out: drafting that token is
    always rejected, and max(0, p - q) = 1e-14 p is all rounding noise, so the recovered
    token is drawn from p itself (with the row's ROLE_FINAL uniform)."""
    rows = 2000
    params = [SamplingParams(temperature=1.0, seed=r) for r in range(rows)]
    batch = standard_rule(SamplingBatch.from_params(params, [3] * rows))
    target_logits = torch.randn(rows, 2, 4, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    target_logits[:, :, 3] = float("-inf")
    p = logits_to_probs(target_logits, batch)  # [B, 2, V], p[..., 3] = 0
    q = (1 - 1e-14) * p[:, :1] + 1e-14 * torch.nn.functional.one_hot(torch.tensor(3), 4)
    ids = torch.full((rows, 1), 3)
    out = rejection_sample(target_logits, ids, torch.ones(rows, dtype=torch.long), q, batch)
    assert (out.num_accepted == 0).all()
    u_final = addressed(batch, torch.zeros(rows, dtype=torch.long), ROLE_FINAL)
    assert torch.equal(out.output_token_ids[:, 0], inverse_cdf_sample(p[:, 0], u_final))


def test_draft_probs_are_weights_normalised_inside():
    """q times a power of two, in any float dtype that holds it exactly, verifies bit for bit the same."""
    params = [SamplingParams(temperature=1.0, seed=r) for r in range(500)]
    target_logits, ids, num_drafted, q = random_round(500, 3, VOCAB, seed=19, params=params)
    q = q.half()  # the wire dtype: values every float dtype below holds exactly
    outs = [
        rejection_sample(target_logits, ids, num_drafted, weights, SamplingBatch.from_params(params)).output_token_ids
        for weights in (q, q.float() * 4, q.double() / 8)
    ]
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


def test_half_precision_target_logits_are_verified():
    params = [SamplingParams(temperature=1.0)] * 10
    target_logits, ids, num_drafted, q = random_round(10, 2, VOCAB, seed=10, params=params)
    batch = SamplingBatch.from_params(params)
    out = rejection_sample(target_logits.to(torch.bfloat16), ids, num_drafted, q.half(), batch)
    assert out.output_token_ids.shape == (10, 3)


# --- input validation --------------------------------------------------------------------


def _valid_inputs(batch: int = 2, gamma: int = 3, vocab: int = VOCAB):
    return dict(
        target_logits=torch.zeros(batch, gamma + 1, vocab),
        draft_token_ids=torch.zeros(batch, gamma, dtype=torch.long),
        num_drafted=torch.full((batch,), gamma),
        draft_probs=torch.full((batch, gamma, vocab), 1 / vocab),
        sampling=SamplingBatch.from_params([SAMPLED] * batch),
    )


@pytest.mark.parametrize(
    "name, bad",
    [
        ("target_logits", torch.zeros(2, VOCAB)),  # not [B, gamma + 1, V]
        ("target_logits", torch.zeros(2, 5, VOCAB)),  # gamma disagrees with the drafts
        ("target_logits", torch.zeros(3, 4, VOCAB)),  # batch disagrees
        ("draft_token_ids", torch.zeros(2, 2, dtype=torch.long)),
        ("draft_token_ids", torch.zeros(2, dtype=torch.long)),
        ("num_drafted", torch.full((3,), 3)),
        ("num_drafted", torch.tensor([4, 0])),  # more than gamma
        ("num_drafted", torch.tensor([-1, 0])),
        ("draft_probs", torch.full((2, 3, VOCAB + 1), 0.1)),  # V differs from the target's
        ("draft_probs", torch.full((2, 2, VOCAB), 0.1)),
        ("draft_token_ids", torch.tensor([[0, 0, VOCAB]] * 2)),  # drafted id outside the vocab
        ("draft_token_ids", torch.tensor([[0, -1, 0]] * 2)),  # padding inside the drafted part
        ("sampling", SamplingBatch.from_params([SAMPLED] * 3)),
    ],
)
def test_inconsistent_shapes_or_ranges_are_rejected(name, bad):
    inputs = _valid_inputs()
    inputs[name] = bad
    with pytest.raises(AssertionError):
        rejection_sample(**inputs)


def test_valid_inputs_pass_validation():
    assert rejection_sample(**_valid_inputs()).output_token_ids.shape == (2, 4)


# --- scale -------------------------------------------------------------------------------


def test_a_batch_of_100k_rows_is_verified_in_one_vectorised_pass():
    rows, gamma, vocab = 100_000, 4, 32
    params = [GREEDY, SamplingParams(temperature=0.8)] * (rows // 2)
    batch = SamplingBatch.from_params(params)
    g = torch.Generator().manual_seed(18)
    target_logits = torch.randn(rows, gamma + 1, vocab, generator=g)
    q = torch.softmax(torch.randn(rows, gamma, vocab, generator=g), dim=-1)
    ids = torch.randint(0, vocab, (rows, gamma), generator=g)
    num_drafted = torch.randint(0, gamma + 1, (rows,), generator=g)
    start = time.perf_counter()
    out = rejection_sample(target_logits, ids, num_drafted, q, batch)
    elapsed = time.perf_counter() - start
    assert out.output_token_ids.shape == (rows, gamma + 1)
    # A per-row Python loop takes tens of seconds here; the vectorised pass well under one
    # on an idle machine. The bound leaves room for a loaded CI box.
    assert elapsed < 5.0, f"took {elapsed:.2f}s"
