"""Latency profiles: the roofline arithmetic, the shipped files, names and their errors."""

from __future__ import annotations

import pytest

from specdec.models.emulated_profile import (
    DEVICES_DIR,
    DeviceProfile,
    LanguageSpec,
    LatencyModel,
    load_profile,
    parse_emulated_name,
    write_profile,
)

LATENCY = LatencyModel(base_ms=6.0, per_row_ms=0.01, knee_tokens=200, per_token_ms=0.03, per_context_token_ms=1e-4)


def test_a_forward_is_flat_while_memory_bound():
    assert LATENCY.forward_ms(1, 1, 0) == pytest.approx(6.01)
    assert LATENCY.forward_ms(1, 200, 0) == pytest.approx(6.01)  # up to the knee: the weights' read only


def test_past_the_knee_each_token_costs_compute():
    assert LATENCY.forward_ms(1, 300, 0) - LATENCY.forward_ms(1, 200, 0) == pytest.approx(100 * 0.03)


def test_rows_and_attended_context_add_their_cost():
    assert LATENCY.forward_ms(32, 32, 0) - LATENCY.forward_ms(1, 32, 0) == pytest.approx(31 * 0.01)
    assert LATENCY.forward_ms(1, 1, 10_000) - LATENCY.forward_ms(1, 1, 0) == pytest.approx(1.0)


@pytest.mark.parametrize("name", ["h100-llama-8b-1b", "4xh100-llama-70b-1b"])
def test_shipped_profiles_load_cite_their_sources_and_draft_cheaper_than_they_verify(name):
    profile = load_profile(name)
    assert profile.sources and all(url.startswith("https://") for url in profile.sources)
    for url in profile.sources:
        assert url in (DEVICES_DIR / f"{name}.yaml").read_text()
    ratio = profile.draft.latency.forward_ms(1, 1, 0) / profile.target.latency.forward_ms(1, 1, 0)
    assert 0.02 < ratio < 0.5  # c: a draft step costs a fraction of a target forward


def test_the_70b_profile_is_fitted_at_tensor_parallel_4():
    assert load_profile("4xh100-llama-70b-1b").target.tensor_parallel_size == 4


def test_names_give_profile_and_role():
    parsed = parse_emulated_name("emulated:h100-llama-8b-1b:draft")
    assert (parsed.profile, parsed.role) == ("h100-llama-8b-1b", "draft")
    assert parse_emulated_name("emulated:/tmp/my:gpu.yaml:target").profile == "/tmp/my:gpu.yaml"


@pytest.mark.parametrize("name", ["emulated:h100-llama-8b-1b", "emulated:h100-llama-8b-1b:verifier",
                                  "emulated::target", "bundled:target"])
def test_malformed_names_are_refused(name):
    with pytest.raises(ValueError, match="emulated:<profile>:target"):
        parse_emulated_name(name)


def test_an_unknown_profile_names_the_shipped_ones():
    with pytest.raises(ValueError, match="h100-llama-8b-1b"):
        load_profile("no-such-gpu")


def test_a_bad_field_is_refused_naming_it(tmp_path):
    data = load_profile("h100-llama-8b-1b").model_dump()
    data["target"]["latency"]["base_ms"] = -1
    path = tmp_path / "bad.yaml"
    write_profile(DeviceProfile.model_validate({**data, "target": {**data["target"], "latency": {
        **data["target"]["latency"], "base_ms": 1}}}), path)
    assert load_profile(str(path)).target.latency.base_ms == 1
    path.write_text(path.read_text().replace("base_ms: 1", "base_ms: -1", 1))
    with pytest.raises(ValueError, match="target.latency.base_ms"):
        load_profile(str(path))


def test_written_profiles_read_back_equal(tmp_path):
    profile = load_profile("4xh100-llama-70b-1b")
    write_profile(profile, tmp_path / "copy.yaml", header="measured\non nothing")
    assert (tmp_path / "copy.yaml").read_text().startswith("# measured\n# on nothing\n")
    assert load_profile(str(tmp_path / "copy.yaml")) == profile


@pytest.mark.parametrize("ranks", [(0.7, 0.4), (-0.1,), (0.1,) * 8 + (0.0,)])
def test_miss_ranks_must_be_shares_of_the_misses(ranks):
    with pytest.raises(ValueError):
        LanguageSpec(miss_ranks=ranks)
