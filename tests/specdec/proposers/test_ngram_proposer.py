"""N-gram prompt lookup proposes what followed the longest earlier match of the context's suffix."""

import numpy as np
import pytest

from even_grammar import EvenGrammar
from specdec.proposers.base import ProposalRequest
from specdec.proposers.ngram_proposer import NgramProposer, find_continuation
from specdec.sampling.grammar_cursor import GrammarCursor
from specdec.sampling.sampling_params import SamplingParams


def cont(tokens, n_min=1, n_max=3, gamma=4):
    return find_continuation(np.array(tokens), n_min, n_max, gamma)


def test_proposes_the_tokens_that_followed_the_earlier_occurrence():
    assert cont([1, 2, 3, 4, 5, 9, 1, 2, 3]) == [4, 5, 9, 1]


def test_longest_suffix_wins_over_a_more_recent_shorter_match():
    # suffix [7, 8, 3]: the 3-gram occurs at the start; the 1-gram "3" occurs later.
    tokens = [7, 8, 3, 10, 11, 3, 12, 7, 8, 3]
    assert cont(tokens, n_min=1, n_max=3) == [10, 11, 3, 12]


def test_most_recent_occurrence_of_the_same_length_wins():
    assert cont([5, 6, 1, 5, 6, 2, 5, 6], n_min=2, n_max=2, gamma=1) == [2]


def test_no_match_no_proposal():
    assert cont([1, 2, 3, 4], n_min=2, n_max=3) == []


def test_proposal_is_cut_at_gamma_and_at_the_end_of_the_context():
    assert cont([1, 2, 1, 2], n_min=2, n_max=2, gamma=8) == [1, 2]


def test_repeated_token_runs_propose_more_of_the_run():
    assert cont([4, 4, 4, 4], n_min=2, n_max=3, gamma=3) == [4]


def test_single_token_context_proposes_nothing():
    assert cont([4], n_min=1, n_max=3) == []


def test_rows_that_found_nothing_draft_nothing():
    proposer = NgramProposer(n_min=2, n_max=3)
    requests = [
        ProposalRequest("a", [1, 2, 3, 1, 2], SamplingParams(), gamma=3),
        ProposalRequest("b", [9, 8, 7], SamplingParams(), gamma=3),
    ]
    proposal = proposer.propose(requests)
    assert [d.token_ids for d in proposal] == [[3, 1, 2], []]
    assert all(d.q is None for d in proposal)


def test_bad_ngram_sizes_are_rejected():
    with pytest.raises(ValueError, match="n_min"):
        NgramProposer(n_min=3, n_max=2)


def test_each_row_proposes_at_most_its_own_gamma():
    proposer = NgramProposer(n_min=2, n_max=3)
    history = [1, 2, 3, 4, 5, 1, 2]
    proposal = proposer.propose([
        ProposalRequest("a", history, SamplingParams(), gamma=1),
        ProposalRequest("b", history, SamplingParams(), gamma=3),
    ])
    assert [d.token_ids for d in proposal] == [[3], [3, 4, 5]]


def test_under_a_grammar_the_proposal_stops_before_its_first_forbidden_token():
    history = [2, 4, 6, 8, 3, 2, 4]  # the suffix [2, 4] was followed by 6, 8, 3, 2
    free = NgramProposer(1, 2).propose([ProposalRequest("s", history, SamplingParams(), gamma=4)])
    grammar = GrammarCursor(EvenGrammar(), 5, 64)  # the output starts after the first 5 tokens
    cut = NgramProposer(1, 2).propose([ProposalRequest("s", history, SamplingParams(), gamma=4, grammar=grammar)])
    assert free[0].token_ids == [6, 8, 3, 2] and cut[0].token_ids == [6, 8]
