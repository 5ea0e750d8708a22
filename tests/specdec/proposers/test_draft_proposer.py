"""The draft proposer follows the history: it rolls back rejected guesses and catches up on missed tokens."""

import pytest
import torch

from specdec.models.model_paths import resolve_model_path
from specdec.models.model_runner import ModelRunner
from specdec.proposers.base import ProposalRequest, common_prefix_length
from specdec.proposers.draft_proposer import DraftModelProposer
from specdec.sampling.sampling_params import SamplingParams

GREEDY = SamplingParams()


@pytest.fixture(scope="module")
def runner():
    return ModelRunner.from_pretrained(resolve_model_path("bundled:draft"), num_slots=4, max_seq_len=512)


def propose(proposer, history, gamma=4, seq_id="s", sampling=GREEDY):
    return proposer.propose([ProposalRequest(seq_id, history, sampling, gamma=gamma)])


def fresh_proposal(runner, history, gamma=4):
    proposer = DraftModelProposer(runner, runner.vocab_size)
    tokens = propose(proposer, history, gamma, seq_id="fresh")[0].token_ids
    proposer.release("fresh")
    return tokens


def test_greedy_proposals_are_the_draft_models_own_continuation(runner, prompt_ids):
    proposer = DraftModelProposer(runner, runner.vocab_size)
    first = propose(proposer, prompt_ids[0])[0].token_ids
    # feeding its own guesses back, one at a time, reproduces them
    history = list(prompt_ids[0])
    for token in first:
        assert fresh_proposal(runner, history, gamma=1) == [token]
        history.append(token)
    proposer.release("s")


def test_after_a_rejection_the_cache_rolls_back_to_the_accepted_prefix(runner, prompt_ids):
    proposer = DraftModelProposer(runner, runner.vocab_size)
    drafted = propose(proposer, prompt_ids[0])[0].token_ids
    recovered = (drafted[2] + 1) % runner.vocab_size  # two accepted, the third rejected
    history = prompt_ids[0] + drafted[:2] + [recovered]
    assert propose(proposer, history)[0].token_ids == fresh_proposal(runner, history)
    slot = proposer._states["s"].slot
    assert runner.slot_length(slot) == len(history) + 3  # history + γ - 1 fed guesses
    proposer.release("s")


def test_after_all_accepted_the_last_guess_and_bonus_are_fed_together(runner, prompt_ids):
    proposer = DraftModelProposer(runner, runner.vocab_size)
    drafted = propose(proposer, prompt_ids[1])[0].token_ids
    history = prompt_ids[1] + drafted + [5]
    assert propose(proposer, history)[0].token_ids == fresh_proposal(runner, history)
    proposer.release("s")


def test_it_catches_up_on_tokens_it_never_saw(runner, prompt_ids):
    """Speculation switched off for a while: the history grew without the draft."""
    proposer = DraftModelProposer(runner, runner.vocab_size)
    propose(proposer, prompt_ids[2])
    history = prompt_ids[2] + prompt_ids[3][:20]
    assert propose(proposer, history)[0].token_ids == fresh_proposal(runner, history)
    proposer.release("s")


def test_each_row_drafts_exactly_its_own_gamma(runner, prompt_ids):
    """A γ = 1 row next to a γ = 5 row drafts one token, the one it drafts alone."""
    proposer = DraftModelProposer(runner, runner.vocab_size)
    alone = fresh_proposal(runner, prompt_ids[1], gamma=1)
    p = proposer.propose([
        ProposalRequest("a", prompt_ids[0], GREEDY, gamma=5),
        ProposalRequest("b", prompt_ids[1], GREEDY, gamma=1),
    ])
    assert [len(d) for d in p] == [5, 1]
    assert p[1].token_ids == alone
    # the γ = 1 row fed no guess back: its cache holds exactly its history
    assert runner.slot_length(proposer._states["b"].slot) == len(prompt_ids[1])
    for seq_id in ("a", "b"):
        proposer.release(seq_id)


def test_a_seeded_rows_drafts_do_not_depend_on_its_neighbours(runner, prompt_ids):
    sampling = SamplingParams(temperature=1.0, seed=5)
    alone = DraftModelProposer(runner, runner.vocab_size)
    mine = alone.propose([ProposalRequest("me", prompt_ids[0], sampling, gamma=2)])
    alone.release("me")
    crowded = DraftModelProposer(runner, runner.vocab_size)
    other = SamplingParams(temperature=1.0, seed=6)
    p = crowded.propose([
        ProposalRequest("x", prompt_ids[2], other, gamma=6),
        ProposalRequest("me", prompt_ids[0], sampling, gamma=2),
    ])
    assert p[1].token_ids == mine[0].token_ids
    # batching may change the forward's last bits (ragged padding), not the draws
    assert torch.allclose(p[1].q, mine[0].q, rtol=1e-4, atol=1e-7)
    for seq_id in ("x", "me"):
        crowded.release(seq_id)


def test_gamma_is_clipped_to_the_drafts_context_down_to_zero(runner):
    """History + γ - 1 fed guesses must fit a slot (max_seq_len 512)."""
    proposer = DraftModelProposer(runner, runner.vocab_size)
    near_full = [7] * 510  # room for 3 tokens: the history's 510 plus 2 fed guesses
    too_long = [7] * 513
    p = proposer.propose([
        ProposalRequest("near", near_full, GREEDY, gamma=8),
        ProposalRequest("over", too_long, GREEDY, gamma=4),
        ProposalRequest("ok", [1, 2, 3], GREEDY, gamma=4),
    ])
    assert [len(d) for d in p] == [3, 0, 4]
    assert "over" not in proposer._states, "a row that cannot draft changes no state"
    for seq_id in ("near", "ok"):
        proposer.release(seq_id)


def test_a_failed_call_forgets_its_rows_and_the_next_call_rebuilds_them(runner, prompt_ids, monkeypatch):
    proposer = DraftModelProposer(runner, runner.vocab_size)
    propose(proposer, prompt_ids[0])
    free = runner.num_free_slots

    def broken(*args, **kwargs):
        raise RuntimeError("device lost")

    monkeypatch.setattr(runner.model, "forward_hidden", broken)  # the catch-up's forward (here a decode step)
    with pytest.raises(RuntimeError, match="device lost"):
        propose(proposer, prompt_ids[0] + [3])
    assert "s" not in proposer._states and runner.num_free_slots == free + 1
    monkeypatch.undo()
    history = prompt_ids[0] + [3]
    assert propose(proposer, history)[0].token_ids == fresh_proposal(runner, history)
    proposer.release("s")


def test_a_failed_decode_step_forgets_its_rows_too(runner, prompt_ids, monkeypatch):
    """The steps after the catch-up run apart from `forward` (`ModelRunner.decode_steps`)."""
    proposer = DraftModelProposer(runner, runner.vocab_size)
    free = runner.num_free_slots
    real, calls = runner.model.forward_hidden, []

    def fails_second(*args, **kwargs):  # the catch-up runs, the first step fails
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("device lost")
        return real(*args, **kwargs)

    monkeypatch.setattr(runner.model, "forward_hidden", fails_second)
    with pytest.raises(RuntimeError, match="device lost"):
        propose(proposer, prompt_ids[0])
    assert "s" not in proposer._states and runner.num_free_slots == free
    monkeypatch.undo()
    assert propose(proposer, prompt_ids[0])[0].token_ids == fresh_proposal(runner, prompt_ids[0])
    proposer.release("s")


@pytest.mark.parametrize("accepted", [2, 4])
def test_a_one_token_catch_up_is_the_first_decode_step_and_drafts_what_a_fresh_proposal_does(
        runner, prompt_ids, monkeypatch, accepted):
    """After a rejection the draft catches up on the pending token alone: that token goes
    through the proposal's decode steps, not a forward of its own. After every draft was
    accepted it catches up on two tokens in one forward. Either way a proposal of γ 4 is 4
    device forwards, and its drafts are a fresh proposal's."""
    proposer = DraftModelProposer(runner, runner.vocab_size)
    drafts = propose(proposer, prompt_ids[0])[0].token_ids
    history = prompt_ids[0] + drafts[:accepted] + [5]  # a rejection at accepted + 1, or the bonus token
    forwards, device = [], []
    forward, forward_hidden = runner.forward, runner.model.forward_hidden
    monkeypatch.setattr(runner, "forward", lambda *a, **k: forwards.append(1) or forward(*a, **k))
    monkeypatch.setattr(runner.model, "forward_hidden", lambda *a, **k: device.append(1) or forward_hidden(*a, **k))
    got = propose(proposer, history)[0].token_ids
    monkeypatch.undo()
    assert (len(forwards), len(device)) == ((0, 4) if accepted < 4 else (1, 4))
    assert got == fresh_proposal(runner, history)
    proposer.release("s")


def test_a_draft_with_no_new_row_does_not_ask_the_cache_to_admit_one(runner, prompt_ids, monkeypatch):
    proposer = DraftModelProposer(runner, runner.vocab_size)
    asked, admits = [], runner.admits
    monkeypatch.setattr(runner, "admits", lambda reserves: asked.append(reserves) or admits(reserves))
    propose(proposer, prompt_ids[0])
    propose(proposer, prompt_ids[0] + [5])
    assert asked == [[None]], "only the new row's call asks (a pass over the cache)"
    proposer.release("s")


def test_a_held_rows_reserve_is_raised_when_its_grant_grows_and_only_then(runner, prompt_ids, monkeypatch):
    proposer = DraftModelProposer(runner, runner.vocab_size)
    history = prompt_ids[0]

    def granted(tokens):
        return [ProposalRequest("s", history, GREEDY, gamma=2, reserve_tokens=tokens)]

    proposer.propose(granted(len(history) + 8))
    slot, raised, grow = proposer._states["s"].slot, [], runner.grow_reserves
    monkeypatch.setattr(runner, "grow_reserves", lambda *args: raised.append(args) or grow(*args))
    proposer.propose(granted(len(history) + 8))  # the same grant: nothing to raise
    assert raised == []
    proposer.propose(granted(len(history) + 200))
    assert len(raised) == 1 and runner.cache.reserve_tokens(slot) >= len(history) + 200
    proposer.release("s")


def test_new_rows_beyond_the_free_slots_draft_nothing(runner):
    proposer = DraftModelProposer(runner, runner.vocab_size)
    requests = [ProposalRequest(f"r{i}", [1, 2, 3], GREEDY, gamma=2) for i in range(runner.num_free_slots + 2)]
    p = proposer.propose(requests)
    assert [len(d) for d in p] == [2] * (len(requests) - 2) + [0, 0]
    for request in requests:
        proposer.release(request.seq_id)


def test_sampled_proposals_carry_q_and_are_seeded(runner, prompt_ids):
    sampling = SamplingParams(temperature=0.9, top_k=50, seed=11)
    outs = []
    for _ in range(2):
        proposer = DraftModelProposer(runner, runner.vocab_size)
        p = propose(proposer, prompt_ids[0], sampling=sampling)
        assert p[0].q.shape == (4, runner.vocab_size)
        assert ((p[0].q > 0).sum(-1) <= 50).all()
        picked = p[0].q.gather(-1, torch.tensor(p[0].token_ids)[:, None])
        assert (picked > 0).all(), "every drafted token must have been possible under q"
        outs.append(p[0].token_ids)
        proposer.release("s")
    assert outs[0] == outs[1]


def test_q_is_padded_to_the_target_vocabulary(runner, prompt_ids):
    proposer = DraftModelProposer(runner, runner.vocab_size + 64)
    p = propose(proposer, prompt_ids[0], sampling=SamplingParams(temperature=1.0, seed=1))
    assert p[0].q.shape[-1] == runner.vocab_size + 64
    assert p[0].q[..., runner.vocab_size :].sum() == 0
    proposer.release("s")


def test_release_frees_the_draft_slot(runner, prompt_ids):
    proposer = DraftModelProposer(runner, runner.vocab_size)
    free = runner.num_free_slots
    propose(proposer, prompt_ids[0])
    assert runner.num_free_slots == free - 1
    proposer.release("s")
    assert runner.num_free_slots == free


def test_common_prefix_length():
    assert common_prefix_length([1, 2, 3], [1, 2, 4, 5]) == 2
    assert common_prefix_length([1, 2], [1, 2, 3]) == 2
    assert common_prefix_length([], [1]) == 0
