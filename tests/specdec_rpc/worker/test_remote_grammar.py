"""Structured output served: the router's engine over gRPC workers (RemoteVerifier to a target
worker, RemoteProposer to a draft worker, drafting ahead as served; no Ray) ships each row's
grammar masks to the target and generates exactly what the in-process engine generates
without speculation, every output matching its grammar. The draft worker gets each row's
grammar and drafts under it exactly as the in-process draft does (the same tokens, and the
same masked q); a grammar it cannot compile costs that row its drafts alone."""

from __future__ import annotations

import json
import re

import pytest
import torch

from specdec.config.config import load_config
from specdec.proposers.base import ProposalRequest
from specdec.requests.grammar_spec import GrammarSpec
from specdec.requests.request import GenerationRequest
from specdec.round.engine import SpeculativeEngine
from specdec.sampling.grammar_cursor import GrammarCursor
from specdec.sampling.grammar_row import GrammarRow
from specdec.sampling.grammar_xgrammar import XGrammarBackend
from specdec.sampling.sampling_params import SamplingParams
from specdec.wiring.engine_builder import build_draft_ahead, decoder
from specdec_rpc.worker.draft_servicer import DraftServicer, load_wire_draft_proposer
from specdec_rpc.worker.remote_proposer import RemoteProposer
from specdec_rpc.worker.remote_verifier import RemoteVerifier
from specdec_rpc.worker.worker_server import ServerThread
import worker_slots

CONFIG = load_config(overrides={"cache": {"num_slots": 4, "max_seq_len": 256}})
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "maximum": 999}},
          "required": ["ok", "n"]}
MAX_NEW = 24
SPEC = GrammarSpec("json_schema", json.dumps(SCHEMA))
PROMPT = 20  # prompt tokens of each proposal row


@pytest.fixture(scope="module")
def served_engine(tokenizer):
    """The router's engine over a draft and a target worker on 127.0.0.1."""
    draft, target = ServerThread(DraftServicer.from_config(CONFIG)), ServerThread(worker_slots.target_servicer(CONFIG))
    verifier, proposer = RemoteVerifier(target.address, 30.0), RemoteProposer(draft.address, 30.0)
    eos = (tokenizer.eos_token_id,)
    yield SpeculativeEngine(verifier, proposer, 4, eos_token_ids=eos, decode=decoder(tokenizer),
                            draft_ahead=build_draft_ahead(), grammars=XGrammarBackend(tokenizer, eos))
    for client in (verifier, proposer):
        client.close()
    for server in (draft, target):
        server.stop()


@pytest.mark.slow
def test_served_output_with_a_grammar_equals_the_in_process_output_without_speculation(served_engine, make_engine,
                                                                                    prompt_ids):
    grammars = [GrammarSpec("json_schema", json.dumps(SCHEMA)), GrammarSpec("regex", "(yes|no), [0-9]{2}")]
    samplings = [SamplingParams(), SamplingParams(temperature=1.0, seed=5)]
    requests = [GenerationRequest(prompt_ids[i], MAX_NEW, s, grammar=g)
                for i, (g, s) in enumerate([(grammars[0], samplings[0]), (grammars[0], samplings[1]),
                                            (grammars[1], samplings[1])])]
    served = served_engine.generate(requests)
    plain = make_engine("none", gamma=0).engine.generate(requests)
    assert [r.token_ids for r in served] == [r.token_ids for r in plain]
    assert served_engine.stats.drafted > 0
    for result in served[:2]:
        assert set(json.loads(result.text)) == {"ok", "n"} and result.finish_reason == "stop"
    assert re.fullmatch("(yes|no), [0-9]{2}", served[2].text)


def schema_row(engine) -> GrammarRow:
    """A row's matcher as the router's engine makes it (the spec rides on its cursors)."""
    vocab = engine.verifier.vocab_size
    return GrammarRow(engine.grammars.matcher(SPEC, vocab), vocab, SPEC)


def test_the_draft_worker_drafts_under_the_grammar_what_the_in_process_draft_drafts(served_engine, prompt_ids):
    """Round after round, greedy and seeded: every served draft is one the grammar allows (only
    its end cuts one), with the in-process draft's tokens and q, the masked distribution drawn from."""
    remote, local, vocab = served_engine.proposer, load_wire_draft_proposer(CONFIG), served_engine.verifier.vocab_size
    samplings = {"greedy": SamplingParams(), "seeded": SamplingParams(temperature=1.0, seed=5)}
    rows = {name: schema_row(served_engine) for name in samplings}
    histories = {name: list(prompt_ids[i][:PROMPT]) for i, name in enumerate(samplings)}
    drafted = 0
    for _ in range(6):
        asks = [ProposalRequest(name, histories[name], sampling, gamma=4, num_prompt_tokens=PROMPT,
                                grammar=rows[name].cursor(len(histories[name])))
                for name, sampling in samplings.items() if not rows[name].ended]
        for ask, served, in_process in zip(asks, remote.propose(asks), local.propose(asks)):
            assert served.token_ids == in_process.token_ids and served.token_ids, ask.seq_id
            if in_process.q is not None:
                assert torch.equal(served.q.decode(vocab), in_process.q), "q is the masked q drawn from"
            kept, _ = rows[ask.seq_id].constrain(served.token_ids)
            rows[ask.seq_id].advance(served.token_ids[:kept])
            assert kept == len(served.token_ids) or rows[ask.seq_id].ended, f"{ask.seq_id}: the grammar cut a draft"
            histories[ask.seq_id] += served.token_ids[:kept]
            drafted += kept
    assert drafted >= 16 and remote.failures == 0
    for name in samplings:
        remote.release(name)
        local.release(name)


def test_a_grammar_the_draft_worker_cannot_compile_costs_its_row_its_drafts_alone(served_engine, prompt_ids):
    remote, good = served_engine.proposer, schema_row(served_engine)
    broken = GrammarCursor(good.matcher.fork(), PROMPT, good.vocab_size, GrammarSpec("regex", "(unclosed"))
    for _ in range(2):  # the grammar rides on the first delta only; the row stays without drafts
        asks = [ProposalRequest(name, list(prompt_ids[i][:PROMPT]), SamplingParams(), gamma=4,
                                num_prompt_tokens=PROMPT, grammar=cursor)
                for i, (name, cursor) in enumerate([("broken", broken), ("fine", good.cursor(PROMPT))])]
        broken_drafts, fine_drafts = remote.propose(asks)
        assert len(broken_drafts) == 0 and len(fine_drafts) == 4
    assert remote.failures == 0 and remote.unavailable_reason is None
    for name in ("broken", "fine"):
        remote.release(name)
