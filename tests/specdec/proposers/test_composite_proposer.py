"""Each request drafts with the proposer it names and keeps that proposer's drafts and q
(a row without q is verified as a one-hot q: tests/specdec/verifiers/test_target_verifier.py)."""

import torch

from specdec.proposers.base import Drafts, ProposalRequest, Proposer
from specdec.proposers.composite_proposer import CompositeProposer
from specdec.sampling.sampling_params import SamplingParams

VOCAB = 6


class Fixed(Proposer):
    def __init__(self, tokens, with_probs):
        self.tokens, self.with_probs = tokens, with_probs

    def propose(self, requests):
        q = torch.full((len(self.tokens), VOCAB), 0.5) if self.with_probs else None
        return [Drafts(list(self.tokens), q) for _ in requests]


def request(seq_id, proposer=None, gamma=2):
    return ProposalRequest(seq_id, [1, 2], SamplingParams(temperature=1.0), proposer, gamma)


def test_rows_go_to_the_proposer_they_name_and_keep_its_q():
    composite = CompositeProposer({"draft": Fixed([3, 4], True), "ngram": Fixed([5], False)}, default="draft")
    p = composite.propose([request("a"), request("b", "ngram"), request("c", "draft")])
    assert [d.token_ids for d in p] == [[3, 4], [5], [3, 4]]
    assert torch.equal(p[0].q, torch.full((2, VOCAB), 0.5)) and torch.equal(p[2].q, p[0].q)
    assert p[1].q is None, "no q is made up for the n-gram row (the verifier verifies it as a one-hot q)"


def test_without_any_q_the_proposal_carries_none():
    composite = CompositeProposer({"ngram": Fixed([5], False)}, default="ngram")
    assert composite.propose([request("a")])[0].q is None


def test_it_names_the_proposers_a_request_may_ask_for():
    composite = CompositeProposer({"draft": Fixed([3], True), "ngram": Fixed([5], False)}, default="draft")
    assert composite.names == ("draft", "ngram")
