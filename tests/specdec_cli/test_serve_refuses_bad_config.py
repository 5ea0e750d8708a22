"""`specdec serve` with a config that cannot start exits 2 with one line naming the file and
the key, before Ray starts (no Ray, no processes: it returns in well under a second)."""

from __future__ import annotations

import pytest
import ray

from specdec_cli.serve_cli import main


@pytest.mark.parametrize("yaml_text, key", [
    ("load_monitor:\n  disable_qps: 3.0\n  enable_qps: 3.0\n", "load_monitor.enable_qps"),
    ("load_monitor:\n  disable_qps: 3.0\n  enable_qps: 1.0\n  disable_in_flight: 8\n", "load_monitor.enable_in_flight"),
    ("serving:\n  http_port: 50051\n", "serving.port"),
])
def test_a_config_that_cannot_start_is_refused_before_ray_starts(tmp_path, capsys, yaml_text, key):
    config = tmp_path / "bad.yaml"
    config.write_text(yaml_text)
    assert main(["serve", "--config", str(config)]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(f"specdec: error: {config}: ") and key in line
    assert not ray.is_initialized()
