"""Under a grammar the draft proposes as the target decodes: every drafted token is one the
grammar allows after the history and the drafts before it, a greedy draft is the masked
argmax, a sampled draft reports the masked, renormalised q it drew from, and the row's own
matcher never moves (bundled draft model, xgrammar on its tokenizer)."""

from __future__ import annotations

import json

import pytest
import torch

from draft_logits import raw_logits
from specdec.models.model_paths import resolve_model_path
from specdec.models.model_runner import ModelRunner
from specdec.proposers.base import ProposalRequest
from specdec.proposers.draft_proposer import DraftModelProposer
from specdec.requests.grammar_spec import GrammarSpec
from specdec.sampling import grammar_mask
from specdec.sampling.grammar_row import GrammarRow
from specdec.sampling.grammar_xgrammar import XGrammarBackend
from specdec.sampling.sampling_params import SamplingParams

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "tags": {"type": "array", "items": {
    "type": "string"}}, "n": {"type": "integer"}}, "required": ["name", "tags", "n"]}
GAMMA = 4


@pytest.fixture(scope="module")
def runner():
    return ModelRunner.from_pretrained(resolve_model_path("bundled:draft"), num_slots=4, max_seq_len=512)


@pytest.fixture(scope="module")
def backend(tokenizer):
    return XGrammarBackend(tokenizer, (tokenizer.eos_token_id,))


def schema_row(backend, runner) -> GrammarRow:
    return GrammarRow(backend.matcher(GrammarSpec("json_schema", json.dumps(SCHEMA)), runner.vocab_size),
                      runner.vocab_size)


def test_every_drafted_token_is_one_the_grammar_allows_and_the_rows_matcher_stays(runner, backend, prompt_ids):
    """Rounds of a greedy and a seeded sampled row under the schema, every draft accepted: the
    grammar keeps each round's whole draft (it forbids none of it), round after round."""
    proposer = DraftModelProposer(runner, runner.vocab_size)
    params = [SamplingParams(), SamplingParams(temperature=1.0, seed=5)]
    rows = [schema_row(backend, runner) for _ in params]
    histories = [list(prompt_ids[i][:20]) for i in range(len(params))]
    for _ in range(6):
        asks = [ProposalRequest(f"s{i}", histories[i], params[i], gamma=GAMMA, num_prompt_tokens=20,
                                grammar=rows[i].cursor(len(histories[i]))) for i in range(len(params))]
        before = [row.constrain([])[1] for row in rows]
        proposal = proposer.propose(asks)
        for i, (row, drafts) in enumerate(zip(rows, proposal)):
            assert torch.equal(row.constrain([])[1], before[i]), "proposing moved the row's matcher"
            kept, _ = row.constrain(drafts.token_ids)
            assert len(drafts) == GAMMA and kept == GAMMA, f"row {i} drafted {drafts.token_ids}: the grammar cut it"
            row.advance(drafts.token_ids)
            histories[i] += drafts.token_ids
    assert not any(row.ended for row in rows)
    for i in range(len(params)):
        proposer.release(f"s{i}")


@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(temperature=0.7)], ids=["greedy", "sampled"])
def test_the_draft_draws_from_its_distribution_masked_by_the_grammar_after_its_earlier_drafts(
        runner, backend, prompt_ids, sampling):
    proposer = DraftModelProposer(runner, runner.vocab_size)
    history, row = list(prompt_ids[2][:16]), schema_row(backend, runner)
    [drafts] = proposer.propose([ProposalRequest("s", history, sampling, gamma=GAMMA, num_prompt_tokens=16,
                                                 grammar=row.cursor(len(history)))])
    proposer.release("s")
    _, masks = row.constrain(drafts.token_ids)  # [GAMMA + 1, W]: the target's masks at these positions
    allowed = grammar_mask.unpack(masks[:GAMMA], runner.vocab_size)  # [GAMMA, V]
    raw = raw_logits(runner, history + drafts.token_ids[:-1])[len(history) - 1:]  # [GAMMA, V]
    masked = raw.masked_fill(~allowed, float("-inf"))
    if sampling.is_greedy:
        assert drafts.q is None and drafts.token_ids == masked.argmax(dim=-1).tolist()
        assert masked.argmax(dim=-1).tolist() != raw.argmax(dim=-1).tolist(), "the mask changed the draft here"
    else:
        expected = torch.softmax(masked / 0.7, dim=-1)  # [GAMMA, V]
        assert torch.allclose(drafts.q.double(), expected, atol=1e-5)
        assert float(drafts.q[~allowed].abs().sum()) == 0.0
