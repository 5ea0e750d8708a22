"""`specdec profile` measures the bundled pair on this CPU and writes a profile that emulated models load."""

from __future__ import annotations

import pytest

from specdec.models.emulated_profile import load_profile
from specdec.models.loader import load_model
from specdec_cli.serve_cli import main


@pytest.mark.slow
def test_profile_writes_a_loadable_profile_of_this_device(tmp_path, capsys):
    out = tmp_path / "this-cpu.yaml"
    assert main(["profile", "--out", str(out), "--max-seq-len", "96", "--rows", "4", "--repeats", "2",
                 "--acceptance", "0.6"]) == 0
    text = out.read_text()
    assert text.startswith("# Measured by `specdec profile` on cpu")
    assert "rows=4 tokens/row=1" in text  # the raw measurements are kept as comments
    profile = load_profile(str(out))
    assert profile.language.acceptance == 0.6
    assert profile.target.latency.forward_ms(1, 1, 16) > 0
    model = load_model(f"emulated:{out}:target", time_scale=0.0)
    assert model.config.num_attention_heads == 8  # the bundled target's shape
    assert f"emulated:{out}:target" in capsys.readouterr().out


def test_profile_refuses_an_output_that_emulated_names_cannot_point_to(tmp_path, capsys):
    assert main(["profile", "--out", str(tmp_path / "profile.txt")]) == 2
    assert "must end in .yaml" in capsys.readouterr().err
