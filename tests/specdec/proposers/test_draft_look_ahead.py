"""The draft model's look-ahead: while a round is verified, it drafts the next round for the
likeliest verdicts (every draft accepted; a rejection at the first, second, ... draft with
the draft's next-best token there; a next-best bonus token), each on a forked slot, exactly
as a fresh proposal from that history would."""

import threading
import time

import pytest
import torch

from specdec.models.model_paths import resolve_model_path
from specdec.models.model_runner import ModelRunner
from specdec.proposers.base import ProposalRequest
from specdec.proposers.draft_proposer import DraftModelProposer
from specdec.sampling.sampling_params import SamplingParams

GREEDY = SamplingParams()
SAMPLED = SamplingParams(temperature=0.8, top_k=50, seed=5)


@pytest.fixture(scope="module")
def runner():
    return ModelRunner.from_pretrained(resolve_model_path("bundled:draft"), num_slots=12, max_seq_len=128)


def proposer_for(runner):
    return DraftModelProposer(runner, runner.vocab_size, wire_dtype=torch.float16)


def drafted_round(proposer, history, sampling=GREEDY, gamma=4, seq_id="s"):
    """The round's history plus the drafts the proposer made for it (the look-ahead's input)."""
    proposal = proposer.propose([ProposalRequest(seq_id, history, sampling, gamma=gamma)])
    return [*history, *proposal[0].token_ids]


def look(proposer, ahead, unverified=4, branches=6, sampling=GREEDY, gamma=4, seq_id="s"):
    return proposer.look_ahead([ProposalRequest(seq_id, ahead, sampling, gamma=gamma)], [unverified], branches)[0]


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_each_branch_drafts_what_a_fresh_proposal_from_its_history_drafts(runner, prompt_ids, sampling):
    proposer = proposer_for(runner)
    ahead = drafted_round(proposer, prompt_ids[0], sampling)
    branches = look(proposer, ahead, sampling=sampling)
    assert branches
    for branch in branches:
        fresh = proposer_for(runner)
        history = [*ahead[: branch.base_length], branch.token_id]
        expected = fresh.propose([ProposalRequest("fresh", history, sampling, gamma=4)])
        fresh.release("fresh")
        assert branch.token_ids == expected[0].token_ids, f"branch at {branch.base_length}"
        if sampling is SAMPLED:
            # the same distributions up to float rounding: a batched forward of several branches
            # may take other kernel paths than a one-row forward (bitwise equal on some CPUs only);
            # the drafted tokens above are equal exactly, and the verifier judges with these probs;
            # q travels as float16, so such a difference may flip one rounding: one ulp (2**-10 relative)
            torch.testing.assert_close(branch.probs, expected[0].q, rtol=1e-3, atol=1e-5)
        else:
            assert branch.probs is None
    proposer.release("s")


def test_six_branches_are_all_accepted_a_rejection_at_every_draft_and_a_second_bonus_token(runner, prompt_ids):
    proposer = proposer_for(runner)
    start = len(prompt_ids[1])
    ahead = drafted_round(proposer, prompt_ids[1])
    branches = look(proposer, ahead, branches=6)
    bases = [b.base_length for b in branches]
    assert bases == [start + 4, start, start + 1, start + 2, start + 3, start + 4], "likeliest first"
    assert [b.base_length for b in look(proposer, ahead, branches=2)] == [start + 4, start]
    for branch in branches:
        if branch.base_length < len(ahead):
            assert branch.token_id != ahead[branch.base_length], "a rejection emits another token than the draft"
    bonus = [b.token_id for b in branches if b.base_length == len(ahead)]
    assert len(set(bonus)) == 2
    assert bonus[0] == proposer_for(runner).propose([ProposalRequest("x", ahead, GREEDY, gamma=1)])[0].token_ids[0], \
        "the first bonus branch is the draft's own next guess"
    proposer.release("s")


def test_one_branch_is_the_plain_look_ahead(runner, prompt_ids):
    proposer = proposer_for(runner)
    ahead = drafted_round(proposer, prompt_ids[2])
    [branch] = look(proposer, ahead, branches=1)
    chain = proposer_for(runner).propose([ProposalRequest("c", ahead, GREEDY, gamma=5)])[0].token_ids
    assert (branch.base_length, branch.token_id, branch.token_ids) == (len(ahead), chain[0], chain[1:])
    proposer.release("s")


def test_forks_beyond_the_free_slots_are_dropped_least_likely_first_and_are_freed(runner, prompt_ids):
    proposer = proposer_for(runner)
    ahead = drafted_round(proposer, prompt_ids[0])
    hold = [runner.allocate_slot() for _ in range(runner.num_free_slots - 2)]
    try:
        branches = look(proposer, ahead, branches=6)
        assert len(branches) == 3 and runner.num_free_slots == 2, "all accepted on the own slot, two forks"
        assert [b.base_length for b in branches] == [len(ahead), len(ahead) - 4, len(ahead) - 3]
        while runner.num_free_slots:
            hold.append(runner.allocate_slot())
        [branch] = look(proposer, ahead, branches=6)
        assert branch.base_length == len(ahead), "with no free slot, the plain look-ahead remains"
    finally:
        for slot in hold:
            runner.free_slot(slot)
    proposer.release("s")


def test_a_round_without_drafts_branches_on_the_targets_next_token(runner, prompt_ids):
    proposer = proposer_for(runner)
    history = drafted_round(proposer, prompt_ids[0])  # the sequence is known to the draft
    branches = look(proposer, history, unverified=0, branches=2)
    assert [b.base_length for b in branches] == [len(history), len(history)]
    proposer.release("s")


def test_unknown_sequences_and_bad_counts_get_no_branches(runner, prompt_ids):
    proposer = proposer_for(runner)
    ahead = drafted_round(proposer, prompt_ids[0])
    assert look(proposer, ahead, seq_id="never-proposed") == []
    assert look(proposer, ahead, unverified=len(ahead)) == [], "more drafts than history"
    assert look(proposer, ahead, gamma=0) == []
    proposer.release("s")


def test_a_failed_look_ahead_forgets_its_rows_and_frees_every_fork(runner, prompt_ids, monkeypatch):
    proposer = proposer_for(runner)
    ahead = drafted_round(proposer, prompt_ids[0])
    free = runner.num_free_slots
    forward = runner.model.forward_hidden  # every forward's, a decode step's too
    calls = []

    def fails_on_the_branches(*args, **kwargs):
        calls.append(1)
        if len(calls) > 1:  # the scoring forward passes; the branches' first forward fails
            raise RuntimeError("device lost")
        return forward(*args, **kwargs)

    monkeypatch.setattr(runner.model, "forward_hidden", fails_on_the_branches)
    with pytest.raises(RuntimeError, match="device lost"):
        look(proposer, ahead)
    monkeypatch.undo()
    assert "s" not in proposer._states and runner.num_free_slots == free + 1


def test_while_a_look_ahead_runs_its_forks_still_count_as_free_for_sequences(runner, prompt_ids, monkeypatch):
    """The worker reports the slots free for sequences (WorkerInfo, metrics): a look-ahead's
    forks are held only during the call."""
    proposer = proposer_for(runner)
    ahead = drafted_round(proposer, prompt_ids[0])
    before = proposer.num_free_slots
    seen = []
    draft = proposer._draft

    def watching(*args, **kwargs):
        seen.append((proposer.num_free_slots, runner.num_free_slots))
        return draft(*args, **kwargs)

    monkeypatch.setattr(proposer, "_draft", watching)
    branches = look(proposer, ahead, branches=4)
    assert seen == [(before, before - (len(branches) - 1))], "three forks held during the call, reported free"
    assert proposer.num_free_slots == runner.num_free_slots == before
    proposer.release("s")


def test_a_reader_on_another_thread_never_sees_a_fork_taken_from_the_free_slots(runner, prompt_ids):
    """The worker's event loop reads num_free_slots while a look-ahead forks and frees slots
    on the worker thread: every reading is the slots free for sequences."""
    proposer = proposer_for(runner)
    ahead = drafted_round(proposer, prompt_ids[0])
    expected, readings, done = proposer.num_free_slots, set(), threading.Event()

    def read() -> None:
        while not done.is_set():
            readings.add(proposer.num_free_slots)
            time.sleep(0)  # let the look-ahead run between readings

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for _ in range(10):
            look(proposer, ahead, branches=6)
    finally:
        done.set()
        reader.join()
    assert readings == {expected}
    proposer.release("s")


def test_a_seeded_sampled_rows_plain_branch_guesses_the_drafts_own_coupled_token(runner, prompt_ids):
    """A seeded sampled request is coupled: the plain look-ahead's bonus token is the draft's
    Gumbel-max choice after its drafts (what a proposal one token longer drafts there), and a
    rejection at a draft branches on the draft's runner-up in the same race, never the
    rejected token itself."""
    proposer = proposer_for(runner)
    ahead = drafted_round(proposer, prompt_ids[0], SAMPLED)
    longer = proposer_for(runner).propose([ProposalRequest("x", prompt_ids[0], SAMPLED, gamma=5)])[0].token_ids
    assert ahead[len(prompt_ids[0]):] == longer[:4]
    branches = look(proposer, ahead, sampling=SAMPLED)
    assert branches[0].base_length == len(ahead) and branches[0].token_id == longer[4]
    for branch in branches[1:]:
        if branch.base_length < len(ahead):
            assert branch.token_id != ahead[branch.base_length]
    proposer.release("s")
