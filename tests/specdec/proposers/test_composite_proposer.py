"""Each request drafts with the proposer it names; a mixed round gives every drafting row a real q."""

import torch

from specdec.proposers.base import Proposal, ProposalRequest, Proposer
from specdec.proposers.composite_proposer import CompositeProposer
from specdec.sampling_params import SamplingParams

VOCAB = 6


class Fixed(Proposer):
    def __init__(self, tokens, with_probs):
        self.tokens, self.with_probs = tokens, with_probs

    def propose(self, requests):
        gamma = max(r.gamma for r in requests)
        p = Proposal.empty(len(requests), gamma)
        p.token_ids[:, : len(self.tokens)] = torch.tensor(self.tokens)
        p.num_drafted[:] = len(self.tokens)
        if self.with_probs:
            p.probs = torch.full((len(requests), gamma, VOCAB), 0.5)
        return p


def request(seq_id, proposer=None, gamma=2):
    return ProposalRequest(seq_id, [1, 2], SamplingParams(temperature=1.0), proposer, gamma)


def test_rows_go_to_the_proposer_they_name_and_q_is_one_hot_where_none_came():
    composite = CompositeProposer({"draft": Fixed([3, 4], True), "ngram": Fixed([5], False)}, default="draft")
    p = composite.propose([request("a"), request("b", "ngram"), request("c", "draft")])
    assert p.token_ids.tolist() == [[3, 4], [5, -1], [3, 4]]
    assert p.num_drafted.tolist() == [2, 1, 2]
    assert torch.equal(p.probs[0], torch.full((2, VOCAB), 0.5))
    assert p.probs[1, 0].tolist() == [0, 0, 0, 0, 0, 1.0] and p.probs[1, 1].sum() == 0


def test_without_any_q_the_proposal_carries_none():
    composite = CompositeProposer({"ngram": Fixed([5], False)}, default="ngram")
    assert composite.propose([request("a")]).probs is None


def test_it_names_the_proposers_a_request_may_ask_for():
    composite = CompositeProposer({"draft": Fixed([3], True), "ngram": Fixed([5], False)}, default="draft")
    assert composite.names == ("draft", "ngram")
