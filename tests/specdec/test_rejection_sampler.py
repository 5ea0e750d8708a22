"""Specification of specdec.rejection_sampler: one round of batched verification.

Deterministic scenarios use targets whose processed distribution is one-hot at a chosen
token (all other logits -inf), so that greedy and sampled verification must agree on the
outcome. Distributional correctness is in test_rejection_sampler_statistics.py.
"""

from __future__ import annotations

import time

import pytest
import torch

from specdec.rejection_sampler import PAD_TOKEN_ID, RejectionOutput, rejection_sample
from specdec.sampling import SamplingBatch, logits_to_probs
from specdec.sampling_params import SamplingParams

VOCAB = 8
GREEDY = SamplingParams(temperature=0.0)
SAMPLED = SamplingParams(temperature=0.8)

# How the drafted tokens are verified: greedy, sampled against draft probabilities q, or
# sampled against an n-gram proposal without probabilities (one-hot q).
KINDS = ["greedy", "sampled", "ngram"]


def _one_hot_logits(tokens: list[list[int]], vocab: int = VOCAB) -> torch.Tensor:
    """[B, T, V] logits whose processed distribution at each position is one-hot at the token."""
    ids = torch.tensor(tokens).unsqueeze(-1)  # [B, T, 1]
    return torch.full((*ids.shape[:2], vocab), float("-inf")).scatter_(-1, ids, 0.0)


def _pad(drafts: list[list[int]], gamma: int, pad: int = PAD_TOKEN_ID) -> tuple[torch.Tensor, torch.Tensor]:
    """Ragged drafted tokens -> (draft_token_ids [B, gamma], num_drafted [B])."""
    ids = torch.full((len(drafts), gamma), pad, dtype=torch.long)
    for r, d in enumerate(drafts):
        ids[r, : len(d)] = torch.tensor(d, dtype=torch.long)
    return ids, torch.tensor([len(d) for d in drafts])


def _verify(kind: str, targets: list[list[int]], drafts: list[list[int]], pad: int = PAD_TOKEN_ID) -> RejectionOutput:
    """Verify drafts against one-hot targets (targets[b] has gamma + 1 positions)."""
    target_logits = _one_hot_logits(targets)  # [B, gamma + 1, V]
    batch, gamma = target_logits.shape[0], target_logits.shape[1] - 1
    ids, num_drafted = _pad(drafts, gamma, pad)
    draft_probs = None if kind == "ngram" else torch.full((batch, gamma, VOCAB), 1.0 / VOCAB)
    params = GREEDY if kind == "greedy" else SAMPLED
    return rejection_sample(target_logits, ids, num_drafted, draft_probs, SamplingBatch.from_params([params] * batch))


def _random_round(batch: int, gamma: int, vocab: int, seed: int, params: list[SamplingParams]):
    """Random target logits, q and drafted tokens sampled from q (num_drafted = gamma)."""
    g = torch.Generator().manual_seed(seed)
    target_logits = torch.randn(batch, gamma + 1, vocab, generator=g)  # [B, gamma + 1, V]
    q = logits_to_probs(torch.randn(batch, gamma, vocab, generator=g), SamplingBatch.from_params(params))
    ids = torch.multinomial(q.reshape(-1, vocab), 1, generator=g).reshape(batch, gamma)  # [B, gamma]
    return target_logits, ids, torch.full((batch,), gamma), q


def _state_after(seed: int, draws: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if draws:
        torch.rand(draws, generator=g)
    return g.get_state()


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
    target_logits, ids, _, q = _random_round(2000, 4, VOCAB, seed=0, params=params)
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
    ids, num_drafted = _pad(drafts, 2)
    q = torch.zeros(1, 2, VOCAB)
    q[..., 7] = 1.0  # claims the draft could only have proposed token 7
    out = rejection_sample(_one_hot_logits(targets), ids, num_drafted, q, SamplingBatch.from_params([GREEDY]))
    assert out.emitted() == [[1, 2, 3]]


def test_greedy_rows_consume_no_randomness():
    target_logits, ids, num_drafted, q = _random_round(4, 3, VOCAB, seed=5, params=[GREEDY] * 4)
    gens = [torch.Generator().manual_seed(i) for i in range(4)]
    global_state = torch.get_rng_state()
    rejection_sample(target_logits, ids, num_drafted, q, SamplingBatch.from_params([GREEDY] * 4, gens))
    assert torch.equal(torch.get_rng_state(), global_state)
    for i, g in enumerate(gens):
        assert torch.equal(g.get_state(), _state_after(i, 0))


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
    target_logits, ids, num_drafted, q = _random_round(5000, 3, VOCAB, seed=7, params=params)
    draft_probs = None if kind == "ngram" else q
    out = rejection_sample(target_logits, ids, num_drafted, draft_probs, SamplingBatch.from_params(params))
    rejected = (out.num_accepted < num_drafted).nonzero().squeeze(-1)
    assert rejected.numel() > 1000
    position = out.num_accepted[rejected]
    assert (out.output_token_ids[rejected, position] != ids[rejected, position]).all()


def test_emitted_tokens_always_lie_in_the_processed_target_support():
    params = [SamplingParams(temperature=1.0, top_k=3), SamplingParams(temperature=0.7, top_p=0.5)] * 2000
    batch = SamplingBatch.from_params(params)
    target_logits, ids, num_drafted, q = _random_round(4000, 3, VOCAB, seed=8, params=params)
    p = logits_to_probs(target_logits, batch)  # [B, 4, V]
    out = rejection_sample(target_logits, ids, num_drafted, q, batch)
    tokens = out.output_token_ids
    emitted = tokens >= 0
    support = p.gather(-1, tokens.clamp(min=0)[..., None]).squeeze(-1) > 0
    assert support[emitted].all()


def test_residual_without_mass_falls_back_to_the_target_distribution():
    # An invalid q (twice p) leaves max(0, p - q) empty at every rejection.
    params = [SamplingParams(temperature=1.0)] * 2000
    batch = SamplingBatch.from_params(params)
    target_logits = torch.randn(2000, 2, 4, generator=torch.Generator().manual_seed(9))
    target_logits[:, :, 3] = float("-inf")
    p = logits_to_probs(target_logits, batch)
    ids = torch.multinomial(p[:, 0], 1)
    out = rejection_sample(target_logits, ids, torch.ones(2000, dtype=torch.long), 2 * p[:, :1], batch)
    assert 0 < int((out.num_accepted == 0).sum()) < 2000
    assert ((out.output_token_ids >= 0) & (out.output_token_ids < 3) | (out.output_token_ids == -1)).all()
    assert (out.output_token_ids[:, 0] >= 0).all()


def test_half_precision_target_logits_are_verified():
    params = [SamplingParams(temperature=1.0)] * 10
    target_logits, ids, num_drafted, q = _random_round(10, 2, VOCAB, seed=10, params=params)
    batch = SamplingBatch.from_params(params)
    out = rejection_sample(target_logits.to(torch.bfloat16), ids, num_drafted, q.half(), batch)
    assert out.output_token_ids.shape == (10, 3)


# --- mixed batches and seeds -------------------------------------------------------------


def _solo(target_logits, ids, num_drafted, q, params, seed):
    """Verify one row alone with a fresh generator for `seed`."""
    gens = [None if seed is None else torch.Generator().manual_seed(seed)]
    return rejection_sample(target_logits, ids, num_drafted, q, SamplingBatch.from_params([params], gens))


def test_mixed_batch_gives_each_row_what_it_gets_alone():
    params = [GREEDY, SamplingParams(temperature=0.8, seed=1), GREEDY, SamplingParams(temperature=1.2, top_k=4, seed=2)]
    target_logits, ids, _, q = _random_round(4, 3, VOCAB, seed=11, params=params)
    num_drafted = torch.tensor([3, 2, 1, 3])
    gens = [None if p.seed is None else torch.Generator().manual_seed(p.seed) for p in params]
    together = rejection_sample(target_logits, ids, num_drafted, q, SamplingBatch.from_params(params, gens))
    for r, p in enumerate(params):
        alone = _solo(target_logits[r : r + 1], ids[r : r + 1], num_drafted[r : r + 1], q[r : r + 1], p, p.seed)
        assert together.emitted()[r] == alone.emitted()[0]


def test_mixed_batch_with_one_hot_targets_gives_the_same_tokens_on_both_paths():
    target_logits = _one_hot_logits([[1, 2, 3]] * 4)
    ids, num_drafted = _pad([[1, 2], [1, 6], [1, 2], [1, 6]], 2)
    batch = SamplingBatch.from_params([GREEDY, GREEDY, SAMPLED, SAMPLED])
    out = rejection_sample(target_logits, ids, num_drafted, torch.full((4, 2, VOCAB), 1 / VOCAB), batch)
    assert out.emitted() == [[1, 2, 3], [1, 2], [1, 2, 3], [1, 2]]


def test_same_seed_gives_the_same_output():
    params = [SamplingParams(temperature=1.0, seed=s) for s in range(300)]
    target_logits, ids, num_drafted, q = _random_round(300, 4, VOCAB, seed=12, params=params)
    first = rejection_sample(target_logits, ids, num_drafted, q, SamplingBatch.from_params(params))
    second = rejection_sample(target_logits, ids, num_drafted, q, SamplingBatch.from_params(params))
    assert torch.equal(first.output_token_ids, second.output_token_ids)


def test_different_seeds_give_different_outputs():
    target_logits, ids, num_drafted, q = _random_round(1, 4, VOCAB, seed=13, params=[SAMPLED])
    outputs = {
        tuple(_solo(target_logits, ids, num_drafted, q, SAMPLED, seed).emitted()[0]) for seed in range(50)
    }
    assert len(outputs) > 1


def test_a_seeded_rows_output_does_not_change_when_other_rows_join_the_batch():
    params = SamplingParams(temperature=0.9, top_p=0.95)
    target_logits, ids, num_drafted, q = _random_round(1, 2, VOCAB, seed=14, params=[params])
    # Join three other rows, and pad everything to a larger gamma of 5.
    others = [SAMPLED, GREEDY, SamplingParams(temperature=1.0, seed=99)]
    big_logits, big_ids, _, big_q = _random_round(4, 5, VOCAB, seed=15, params=[params, *others])
    big_logits[0, :3], big_ids[0, :2], big_q[0, :2] = target_logits[0], ids[0], q[0]
    big_num_drafted = torch.tensor([2, 5, 4, 3])
    for seed in range(20):
        alone_batch = SamplingBatch.from_params([params], [torch.Generator().manual_seed(seed)])
        gens = [torch.Generator().manual_seed(seed), None, None, torch.Generator().manual_seed(99)]
        joined_batch = SamplingBatch.from_params([params, *others], gens)
        for _ in range(2):  # the second round checks the generator was advanced the same way
            alone = rejection_sample(target_logits, ids, num_drafted, q, alone_batch)
            joined = rejection_sample(big_logits, big_ids, big_num_drafted, big_q, joined_batch)
            assert joined.emitted()[0] == alone.emitted()[0]


def test_a_seeded_row_draws_num_drafted_plus_one_uniforms_per_round():
    target_logits, ids, _, q = _random_round(2, 4, VOCAB, seed=16, params=[SAMPLED] * 2)
    gens = [torch.Generator().manual_seed(1), torch.Generator().manual_seed(2)]
    rejection_sample(target_logits, ids, torch.tensor([4, 1]), q, SamplingBatch.from_params([SAMPLED] * 2, gens))
    assert torch.equal(gens[0].get_state(), _state_after(1, 5))
    assert torch.equal(gens[1].get_state(), _state_after(2, 2))


def test_generators_carry_on_across_rounds():
    target_logits, ids, num_drafted, q = _random_round(1, 3, VOCAB, seed=17, params=[SAMPLED])

    def thirty_rounds(batch: SamplingBatch) -> list[list[int]]:
        return [rejection_sample(target_logits, ids, num_drafted, q, batch).emitted()[0] for _ in range(30)]

    rounds = thirty_rounds(SamplingBatch.from_params([SAMPLED], [torch.Generator().manual_seed(5)]))
    again = thirty_rounds(SamplingBatch.from_params([SAMPLED], [torch.Generator().manual_seed(5)]))
    assert rounds == again
    assert len({tuple(r) for r in rounds}) > 1


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
