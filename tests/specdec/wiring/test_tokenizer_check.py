"""Draft and target must map the same tokens to the same ids; otherwise start-up fails clearly."""

import json
import shutil

import pytest

from specdec.config.config import load_config
from specdec.wiring.engine_builder import build_engine
from specdec.models.model_paths import resolve_model_path
from specdec.wiring.tokenizer_check import TokenizerMismatchError, check_tokenizers_compatible


def test_the_bundled_pair_is_compatible(tokenizer):
    check_tokenizers_compatible(tokenizer, tokenizer, 4096, 4096)


def test_extra_padding_rows_in_a_model_are_fine(tokenizer):
    check_tokenizers_compatible(tokenizer, tokenizer, len(tokenizer) + 64, len(tokenizer))


def test_a_model_with_fewer_rows_than_tokens_is_rejected(tokenizer):
    with pytest.raises(TokenizerMismatchError, match="draft model has 100 vocabulary rows"):
        check_tokenizers_compatible(tokenizer, tokenizer, len(tokenizer), 100)


def test_a_draft_with_swapped_token_ids_fails_at_start_up_naming_the_tokens(tmp_path):
    draft_dir = tmp_path / "draft"
    shutil.copytree(resolve_model_path("bundled:draft"), draft_dir)
    tok_file = draft_dir / "tokenizer.json"
    data = json.loads(tok_file.read_text())
    vocab = data["model"]["vocab"]
    a, b = "def", "return"
    vocab[a], vocab[b] = vocab[b], vocab[a]
    tok_file.write_text(json.dumps(data))
    config = load_config(overrides={"models": {"draft": str(draft_dir)}})
    with pytest.raises(TokenizerMismatchError) as info:
        build_engine(config)
    message = str(info.value)
    assert "2 token ids" in message and repr(a) in message and repr(b) in message
