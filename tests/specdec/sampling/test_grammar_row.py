"""A request's grammar on the engine's side: xgrammar behind the one matcher interface, built
offline from the local tokenizer (the bundled pair's and the emulated one); masks that say
exactly which tokens may come next; drafts cut after their first forbidden token; the matcher
back where it started after checking a draft, and moved only by emitted tokens."""

from __future__ import annotations

import json

import pytest
import torch

from specdec.models.emulated_tokenizer import emulated_tokenizer
from specdec.requests.errors import InvalidRequestError
from specdec.sampling.grammar_matcher import GrammarError
from specdec.requests.grammar_spec import GrammarSpec
from specdec.sampling import grammar_mask
from specdec.sampling.grammar_matcher import allows, mask_width
from specdec.sampling.grammar_row import GrammarRow, GrammarViolation
from specdec.sampling.grammar_xgrammar import XGrammarBackend

VOCAB = 4096  # the bundled pair's logits
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}


@pytest.fixture(scope="module")
def backend(tokenizer):
    return XGrammarBackend(tokenizer, (tokenizer.eos_token_id,))


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def row(backend, spec: GrammarSpec) -> GrammarRow:
    return GrammarRow(backend.matcher(spec, VOCAB), VOCAB)


def allowed_tokens(mask: torch.Tensor) -> set[int]:
    return set(grammar_mask.unpack(mask, VOCAB).nonzero().squeeze(-1).tolist())


def test_the_mask_allows_exactly_the_tokens_that_continue_the_grammar(backend, tokenizer):
    digits = row(backend, GrammarSpec("regex", "[0-9]+"))
    _, masks = digits.constrain([])
    allowed = allowed_tokens(masks[0])
    assert allowed and all(tokenizer.decode([t]).isdigit() for t in allowed)
    assert tokenizer.eos_token_id not in allowed, "the grammar cannot end before its first digit"
    digits.advance(encode(tokenizer, "7"))
    assert tokenizer.eos_token_id in allowed_tokens(digits.constrain([])[1][0]), "now it may end"


def test_a_draft_is_cut_after_its_first_forbidden_token_and_the_matcher_is_left_where_it_was(backend, tokenizer):
    json_row = row(backend, GrammarSpec("json_schema", json.dumps(SCHEMA)))
    good = encode(tokenizer, '{"ok": true}')
    kept, masks = json_row.constrain(good + [tokenizer.eos_token_id])
    assert kept == len(good) + 1 and masks.shape == (kept + 1, mask_width(VOCAB))
    for i, token in enumerate(good):
        assert allows(masks[i].numpy(), token)
    bad = good[:2] + encode(tokenizer, "x") + good[2:]
    kept, masks = json_row.constrain(bad)
    assert kept == 3, "the forbidden token stays (the target rejects it), what follows it goes"
    assert not allows(masks[2].numpy(), bad[2]) and masks.shape[0] == 4
    assert json_row.constrain([])[1][0].equal(masks[0]), "checking drafts moved nothing"


def test_emitted_tokens_advance_the_matcher_and_its_end_ends_the_output(backend, tokenizer):
    json_row = row(backend, GrammarSpec("json_object"))
    first, rest = encode(tokenizer, '{"a": 1'), encode(tokenizer, "}")
    assert json_row.advance(first) == first and not json_row.ended
    tail = rest + [tokenizer.eos_token_id, 5, 6]
    assert json_row.advance(tail) == rest + [tokenizer.eos_token_id], "nothing after the grammar's end"
    assert json_row.ended


def test_a_token_the_grammar_forbids_fails_the_row(backend, tokenizer):
    with pytest.raises(GrammarViolation, match="grammar"):
        row(backend, GrammarSpec("regex", "[0-9]+")).advance(encode(tokenizer, "abc"))


def test_a_draft_that_ends_the_grammar_stops_there(backend, tokenizer):
    digits = row(backend, GrammarSpec("regex", "[0-9]"))
    draft = encode(tokenizer, "4") + [tokenizer.eos_token_id] + encode(tokenizer, "5")
    kept, masks = digits.constrain(draft)
    assert kept == 2 and masks.shape[0] == 3


@pytest.mark.parametrize("spec, reason", [
    (GrammarSpec("json_schema", '{"type": "objectx"}'), "objectx"),
    (GrammarSpec("json_schema", "{not json"), "does not compile"),
    (GrammarSpec("regex", "a(("), "parenthesis"),
    (GrammarSpec("ebnf", "root ::= "), "does not compile"),
])
def test_a_grammar_that_does_not_compile_is_refused_naming_its_text(backend, spec, reason):
    with pytest.raises(GrammarError, match=reason) as error:
        backend.matcher(spec, VOCAB)
    assert error.value.param == "grammar.text"


def test_a_spec_needs_a_known_kind_and_its_text():
    with pytest.raises(InvalidRequestError) as error:
        GrammarSpec("xml", "<a/>")
    assert error.value.param == "grammar.kind"
    with pytest.raises(InvalidRequestError) as error:
        GrammarSpec("regex", " ")
    assert error.value.param == "grammar.text"


def test_each_distinct_grammar_compiles_once_and_the_cache_keeps_the_most_recent(tokenizer):
    backend = XGrammarBackend(tokenizer, (tokenizer.eos_token_id,), cache_size=2)
    specs = [GrammarSpec("regex", f"[0-9]{{{n}}}") for n in (1, 2, 3)]
    first = backend.compiled(specs[0], VOCAB)
    assert backend.compiled(GrammarSpec("regex", "[0-9]{1}"), VOCAB) is first, "an equal spec is not recompiled"
    backend.compiled(specs[1], VOCAB)
    backend.compiled(specs[2], VOCAB)
    assert backend.cached == 2 and backend.compiled(specs[0], VOCAB) is not first, "the least recent was evicted"


def test_the_emulated_tokenizer_builds_its_grammar_offline():
    vocab = 2048
    tokenizer = emulated_tokenizer(vocab)
    digits = GrammarRow(XGrammarBackend(tokenizer, (tokenizer.eos_token_id,)).matcher(
        GrammarSpec("regex", "[0-9]{2}"), vocab), vocab)
    allowed = set(grammar_mask.unpack(digits.constrain([])[1][0], vocab).nonzero().squeeze(-1).tolist())
    assert allowed and all(tokenizer.decode([t]).isdigit() for t in allowed)


def test_masks_travel_as_bytes_and_mask_logits_to_minus_infinity():
    masks = torch.tensor([[0b1010, 0], [-1, 1]], dtype=torch.int32)  # [2 positions, W = 2]
    assert grammar_mask.from_bytes(grammar_mask.to_bytes(masks), 2).equal(masks)
    assert grammar_mask.from_bytes(b"", 1) is None
    with pytest.raises(ValueError, match="token_mask"):
        grammar_mask.from_bytes(b"\0" * 12, 2)
    logits = torch.zeros(1, 2, 40)
    masked = grammar_mask.apply_masks(logits, masks[None])
    assert torch.isfinite(masked[0, 0]).nonzero().squeeze(-1).tolist() == [1, 3]
    assert torch.isfinite(masked[0, 1]).nonzero().squeeze(-1).tolist() == list(range(32)) + [32]
    rows = grammar_mask.batch_masks([None, masks[:1]], 3, 40)
    assert rows.shape == (2, 3, 2) and bool((rows[0] == -1).all()) and rows[1, 0].equal(masks[0])
    assert bool((rows[1, 1:] == -1).all()) and grammar_mask.batch_masks([None], 3, 40) is None
