"""Structured output in the engine (bundled pair, in-process): the output matches the grammar,
the grammar's end ends it ("stop"), and speculation changes nothing - greedy and seeded
outputs with a grammar are the same with speculation on and off. A grammar that does not
compile is refused at admission naming grammar.text; a grammar failing mid-request fails that
request alone."""

from __future__ import annotations

import json
import math
import re

import pytest

from specdec.requests.grammar_spec import GrammarSpec
from specdec.requests.request import GenerationRequest
from specdec.sampling.grammar_matcher import GrammarBackend, GrammarError
from specdec.sampling.sampling_params import SamplingParams

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 6},
                                           "n": {"type": "integer", "minimum": 0, "maximum": 99}},
          "required": ["name", "n"]}
GRAMMARS = [GrammarSpec("json_schema", json.dumps(SCHEMA)), GrammarSpec("regex", "[a-z]{2,5}-[0-9]{1,3}")]
SAMPLINGS = [SamplingParams(), SamplingParams(temperature=1.0, seed=11)]
MAX_NEW = 24


@pytest.fixture(scope="module")
def engines(make_engine):
    return make_engine("draft", gamma=4).engine, make_engine("none", gamma=0).engine


def requests(prompt_ids) -> list[GenerationRequest]:
    """JSON greedy and seeded, the regex greedy."""
    pairs = [(GRAMMARS[0], SAMPLINGS[0]), (GRAMMARS[0], SAMPLINGS[1]), (GRAMMARS[1], SAMPLINGS[0])]
    return [GenerationRequest(prompt_ids[i], MAX_NEW, sampling, grammar=grammar)
            for i, (grammar, sampling) in enumerate(pairs)]


@pytest.mark.slow
def test_with_a_grammar_speculation_changes_nothing_and_every_output_matches_it(engines, prompt_ids):
    speculating, plain = engines
    on, off = speculating.generate(requests(prompt_ids)), plain.generate(requests(prompt_ids))
    assert [r.token_ids for r in on] == [r.token_ids for r in off]
    assert sum(r.stats.drafted for r in on) > 0
    for result in on[:2]:
        value = json.loads(result.text)
        assert set(value) == {"name", "n"} and 0 <= value["n"] <= 99 and result.finish_reason == "stop"
    for result in on[2:]:
        assert re.fullmatch("[a-z]{2,5}-[0-9]{1,3}", result.text) and result.finish_reason == "stop"


def test_the_grammars_end_ends_the_output_even_past_ignored_eos(engines, prompt_ids):
    speculating, _ = engines
    [result] = speculating.generate([GenerationRequest(prompt_ids[0], MAX_NEW, ignore_eos=True,
                                                       grammar=GrammarSpec("regex", "ok"))])
    assert result.text == "ok" and result.finish_reason == "stop"


def test_logprobs_under_a_grammar_report_the_masked_distribution_the_output_follows(engines, prompt_ids):
    """The regex "ok" allows only tokens that spell its rest: every alternative reported has
    such a token, and at every position they carry the whole probability (the mask's)."""
    speculating, _ = engines
    [result] = speculating.generate([GenerationRequest(prompt_ids[1], MAX_NEW, logprobs=5,
                                                       grammar=GrammarSpec("regex", "ok"))])
    assert result.text == "ok" and len(result.logprobs) == len(result.token_ids)
    written = ""
    for entry in result.logprobs:
        allowed = [(t, lp) for t, lp in entry.top if lp > float("-inf")]
        rest = "ok"[len(written):]
        assert all(rest.startswith(speculating.decode([t])) for t, _ in allowed), (rest, allowed)
        assert sum(math.exp(lp) for _, lp in allowed) == pytest.approx(1.0, abs=1e-4)
        written += speculating.decode([entry.token_id])


def test_a_grammar_that_does_not_compile_is_refused_at_admission(engines, prompt_ids):
    with pytest.raises(GrammarError) as error:
        engines[0].add_request(GenerationRequest(prompt_ids[0], 8, grammar=GrammarSpec("regex", "(")))
    assert error.value.param == "grammar.text"


class FailingGrammars(GrammarBackend):
    """The real backend, except that the regex "boom" fails at its first mask."""

    def __init__(self, real: GrammarBackend) -> None:
        self.real = real

    def check(self, spec: GrammarSpec) -> None:
        self.real.check(spec)

    def matcher(self, spec, vocab_size):
        matcher = self.real.matcher(spec, vocab_size)
        if spec.text == "boom":
            def fail(out):
                raise RuntimeError("the grammar engine broke")
            matcher.fill_mask = fail
        return matcher


def test_a_grammar_that_fails_mid_request_fails_that_request_alone(make_engine, prompt_ids):
    engine = make_engine("draft", gamma=4).engine
    engine.grammars = FailingGrammars(engine.grammars)
    good = engine.add_request(GenerationRequest(prompt_ids[0], 12, grammar=GrammarSpec("regex", "[0-9]{4}")))
    bad = engine.add_request(GenerationRequest(prompt_ids[1], 12, grammar=GrammarSpec("regex", "boom")))
    while engine.has_unfinished():
        engine.step()
    assert re.fullmatch("[0-9]{4}", engine.result(good).text)
    with pytest.raises(RuntimeError, match="broke"):
        engine.result(bad)
