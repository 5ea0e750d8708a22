"""Structured output served: the router's engine over gRPC workers (RemoteVerifier to a target
worker, RemoteProposer to a draft worker, drafting ahead as served; no Ray) ships each row's
grammar masks to the target and generates exactly what the in-process engine generates
without speculation, every output matching its grammar."""

from __future__ import annotations

import json
import re

import pytest

from specdec.config.config import load_config
from specdec.requests.grammar_spec import GrammarSpec
from specdec.requests.request import GenerationRequest
from specdec.round.engine import SpeculativeEngine
from specdec.sampling.grammar_xgrammar import XGrammarBackend
from specdec.sampling.sampling_params import SamplingParams
from specdec.wiring.engine_builder import build_draft_ahead, decoder
from specdec_rpc.worker.draft_servicer import DraftServicer
from specdec_rpc.worker.remote_proposer import RemoteProposer
from specdec_rpc.worker.remote_verifier import RemoteVerifier
from specdec_rpc.worker.worker_server import ServerThread
import worker_slots

CONFIG = load_config(overrides={"cache": {"num_slots": 4, "max_seq_len": 256}})
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "maximum": 999}},
          "required": ["ok", "n"]}
MAX_NEW = 24


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
