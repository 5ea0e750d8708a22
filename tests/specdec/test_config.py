"""Configuration is typed and strict, and configs/default.yaml documents the real defaults."""

from pathlib import Path

import pytest
from pydantic import BaseModel, ValidationError

from specdec.config import SpecdecConfig, load_config, read_yaml

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


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


def test_unknown_keys_are_errors(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("speculation:\n  gama: 3\n")
    with pytest.raises(ValidationError, match="gama"):
        load_config(bad)


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
    ],
)
def test_bad_values_are_rejected_naming_the_field(overrides, field):
    with pytest.raises(ValidationError, match=field):
        load_config(overrides=overrides)
