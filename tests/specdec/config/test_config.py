"""Configuration is typed and strict, and configs/default.yaml documents the real defaults."""

from pathlib import Path

import pytest
from pydantic import BaseModel

from specdec.config.config import ConfigError, SpecdecConfig, load_config, read_yaml

CONFIGS = Path(__file__).resolve().parents[3] / "configs"


def test_default_yaml_equals_the_schema_defaults():
    assert SpecdecConfig.model_validate(read_yaml(CONFIGS / "default.yaml")) == SpecdecConfig()
    assert read_yaml(CONFIGS / "default.yaml") == SpecdecConfig().model_dump()


def test_every_key_of_default_yaml_has_a_comment_above_it():
    lines = (CONFIGS / "default.yaml").read_text().splitlines()
    for i, line in enumerate(lines):
        stripped = line.strip()
        if stripped and not stripped.startswith("#") and ":" in stripped:
            assert lines[i - 1].strip().startswith("#"), f"line {i + 1} has no comment: {line!r}"


def _fields(model: type[BaseModel]):
    for name, field in model.model_fields.items():
        yield model.__name__, name, field
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            yield from _fields(annotation)


def test_every_field_has_a_description():
    missing = [f"{owner}.{name}" for owner, name, field in _fields(SpecdecConfig) if not field.description]
    assert not missing


def test_unknown_keys_are_errors_in_one_line_naming_the_file_and_the_key(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("speculation:\n  gama: 3\n")
    with pytest.raises(ConfigError) as error:
        load_config(CONFIGS / "ngram.yaml", bad)
    assert str(error.value) == f"{bad}: speculation.gama: unknown key"


def test_a_bad_value_names_the_file_that_set_it_and_what_it_got(tmp_path):
    first, second = tmp_path / "first.yaml", tmp_path / "second.yaml"
    first.write_text("serving:\n  port: 70000\n")
    second.write_text("serving:\n  host: 127.0.0.1\n")
    with pytest.raises(ConfigError) as error:
        load_config(first, second)
    assert str(error.value) == f"{first}: serving.port: Input should be less than or equal to 65535 (got 70000)"
    with pytest.raises(ConfigError, match=r"^command line: cache.num_slots: .* \(got 0\)$"):
        load_config(first, overrides={"serving": {"port": 1}, "cache": {"num_slots": 0}})


def test_broken_or_missing_yaml_is_one_line_with_the_position(tmp_path):
    broken = tmp_path / "broken.yaml"
    broken.write_text("serving:\n  port: [1\n")
    with pytest.raises(ConfigError, match=rf"^{broken}: not valid YAML at line 3, column 1: expected"):
        load_config(broken)
    with pytest.raises(ConfigError, match=r"absent.yaml: cannot read: No such file"):
        load_config(tmp_path / "absent.yaml")
    listed = tmp_path / "list.yaml"
    listed.write_text("- 1\n")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(listed)


@pytest.mark.parametrize("name", ["ngram.yaml", "no-speculation.yaml"])
def test_override_files_apply_on_top_of_the_defaults(name):
    config = load_config(CONFIGS / name)
    assert config.speculation.proposer in {"ngram", "none"}
    assert config.cache == SpecdecConfig().cache


def test_later_overrides_win_and_nested_keys_merge():
    config = load_config(CONFIGS / "ngram.yaml", overrides={"speculation": {"ngram": {"n_max": 5}}})
    assert (config.speculation.proposer, config.speculation.gamma, config.speculation.ngram.n_max) == ("ngram", 6, 5)
    assert config.speculation.ngram.n_min == 2


@pytest.mark.parametrize(
    "overrides, field",
    [
        ({"speculation": {"gamma": -1}}, "gamma"),
        ({"speculation": {"ngram": {"n_min": 5, "n_max": 2}}}, "n_min"),
        ({"cache": {"num_slots": 0}}, "num_slots"),
        ({"models": {"dtype": "int8"}}, "dtype"),
        ({"load_monitor": {"window_s": 30.0, "cost_window_s": 10.0}}, "cost_window_s"),
        ({"load_monitor": {"max_round_ratio": -1}}, "max_round_ratio"),
        ({"models": {"runner": "vllm"}}, "runner"),
        ({"models": {"runner": "transformers"}, "serving": {"tensor_parallel_size": 2}}, "tensor_parallel_size"),
        ({"cache": {"max_seq_len": 32768}}, "cache.max_seq_len .* default cache.memory_budget"),
        ({"serving": {"ingress": "direct", "direct_port": 50050}}, "serving.port .* serving.direct_port"),
        ({"serving": {"ingress": "direct", "direct_http_port": 7999}}, "serving.http_port .* serving.direct_http_port"),
        ({"serving": {"ingress": "direct", "direct_port": 65533}}, "direct_port: .* past 65535"),
        ({"serving": {"ingress": "direct", "router_replicas": 2, "direct_port": 30007}}, "overlap"),
        ({"serving": {"ingress": "sidecar"}}, "ingress"),
    ],
)
def test_bad_values_are_rejected_naming_the_field(overrides, field):
    with pytest.raises(ConfigError, match=field) as error:
        load_config(overrides=overrides)
    assert "\n" not in str(error.value) and "pydantic" not in str(error.value)


@pytest.mark.parametrize("key, replacement", [
    ("gamma_max", "speculation.gamma_limit"), ("overlap_measured", "overlap_choice"),
    ("overlap_min_acceptance", "draft_ahead"), ("look_ahead_min_hit_rate", "overlap_choice"),
    ("look_ahead_probe_every", "overlap_choice"), ("overlap_micro_batches", "overlap_choice"),
    ("overlap_max_rows", "overlap_choice"), ("look_ahead_branches", "look_ahead_hits"),
])
def test_a_retired_speculation_key_is_refused_naming_what_replaces_it(key, replacement):
    with pytest.raises(ConfigError, match=f"speculation.{key}: .*{replacement}"):
        load_config(overrides={"speculation": {key: 1}})


def test_the_default_cache_is_a_memory_budget_and_the_slot_count_only_a_cap():
    """The memory of the former 16 x 1,024-token slot cache, shared by as many sequences as their
    lengths allow; max_seq_len follows the model; a budget the operator sets replaces the default."""
    cache = load_config().cache
    assert (cache.memory_budget, cache.max_seq_len, cache.kv_tokens) == (None, None, 16 * 1024)
    assert cache.num_slots >= 16 * 8, "the cap is far above what the budget holds of short sequences"
    budgeted = load_config(overrides={"cache": {"memory_budget": 0.25, "max_seq_len": 32768}}).cache
    assert budgeted.kv_tokens is None and budgeted.max_seq_len == 32768
