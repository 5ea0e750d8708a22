"""`specdec generate` on the bundled pair: text or one JSON object; bad input exits 2 naming the field."""

import json
import subprocess
import sys

import pytest

from specdec.wiring.cli import main


def run_cli(capsys, *args):
    code = main(["generate", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_json_output_has_text_token_ids_and_stats(capsys):
    code, out, _ = run_cli(capsys, "--prompt", "def add(a, b):", "--max-new-tokens", "12", "--json")
    assert code == 0
    result = json.loads(out)
    assert isinstance(result["text"], str) and 1 <= len(result["token_ids"]) <= 12
    for key in ("rounds", "drafted", "accepted", "acceptance_rate", "mean_accepted_length", "tokens_per_s"):
        assert key in result["stats"]
    assert result["stats"]["rounds"] >= 1


def test_every_proposer_gives_the_same_greedy_text(capsys):
    texts = set()
    for proposer in ("draft", "ngram", "none"):
        code, out, _ = run_cli(capsys, "--prompt", "import os\n", "--max-new-tokens", "16",
                               "--proposer", proposer, "--json")
        assert code == 0
        texts.add(json.loads(out)["text"])
    assert len(texts) == 1


def test_plain_output_prints_prompt_and_continuation(capsys):
    code, out, _ = run_cli(capsys, "--prompt", "class Foo:", "--max-new-tokens", "4")
    assert code == 0 and out.startswith("class Foo:")


def test_seeded_sampling_is_reproducible(capsys):
    args = ("--prompt", "def f(x):", "--max-new-tokens", "16", "--temperature", "0.9", "--top-p", "0.9",
            "--seed", "5", "--json")
    first = json.loads(run_cli(capsys, *args)[1])["token_ids"]
    assert json.loads(run_cli(capsys, *args)[1])["token_ids"] == first


@pytest.mark.parametrize(
    "args, field",
    [
        (["--prompt", ""], "prompt"),
        (["--prompt", "x", "--max-new-tokens", "0"], "max_new_tokens"),
        (["--prompt", "x", "--max-new-tokens", "1000000"], "max_new_tokens"),
        (["--prompt", "x", "--temperature", "-1"], "temperature"),
        (["--prompt", "x", "--top-p", "0"], "top_p"),
        (["--prompt", "x", "--top-p", "1.5"], "top_p"),
        (["--prompt", "x", "--top-k", "-2"], "top_k"),
        (["--prompt", "x", "--gamma", "-1"], "gamma"),
        (["--prompt", "x " * 3000], "prompt"),  # past the bundled target's context of 2,048 tokens
    ],
)
def test_bad_input_exits_2_naming_the_field(capsys, args, field):
    code, _, err = run_cli(capsys, *args)
    assert code == 2
    assert field in err and "Traceback" not in err


def test_console_script_is_installed():
    out = subprocess.run([sys.executable, "-m", "specdec.wiring.cli", "generate", "--help"], capture_output=True,
                         text=True)
    assert out.returncode == 0 and "--proposer" in out.stdout


@pytest.mark.parametrize(
    "command", [[sys.executable, "-m", "specdec.wiring.cli", "generate", "--prompt", "x"],
                [sys.executable, "-m", "specdec_cli.serve_cli", "serve", "--port", "1"]],
    ids=["generate", "serve"],
)
@pytest.mark.parametrize(
    "yaml_text, expected",
    [
        ("speculation:\n  gama: 3\n", "{path}: speculation.gama: unknown key"),
        ("serving:\n  port: [1\n", "{path}: not valid YAML at line 3, column 1"),
        ("models:\n  target: /no/such/model\n", "models.target: model directory '/no/such/model' does not exist"),
        ("models:\n  draft: {tmp}\n", "models.draft: '{tmp}' is not a model directory (no config.json in it)"),
    ],
    ids=["unknown key", "broken yaml", "missing model", "not a model"],
)
def test_a_bad_config_ends_the_command_in_seconds_with_one_line_and_exit_2(tmp_path, command, yaml_text, expected):
    """Checked before Ray starts or any weights load: one line naming the file or the key."""
    path = tmp_path / "bad.yaml"  # tmp_path itself: a directory without config.json
    path.write_text(yaml_text.replace("{tmp}", str(tmp_path)))
    out = subprocess.run([*command, "--config", str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("specdec: error: ")
    assert expected.format(path=path, tmp=tmp_path) in lines[0]


def test_version_and_log_level():
    out = subprocess.run([sys.executable, "-m", "specdec.wiring.cli", "--version"], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.startswith("specdec ")
    out = subprocess.run([sys.executable, "-m", "specdec.wiring.cli", "--log-level", "chatty", "generate", "--help"],
                         capture_output=True, text=True)
    assert out.returncode == 2 and "--log-level" in out.stderr


def test_serve_checks_the_security_files_before_ray_starts(tmp_path):
    path = tmp_path / "secure.yaml"
    path.write_text(f"security:\n  api_tokens_file: {tmp_path}/absent-tokens\n")
    out = subprocess.run([sys.executable, "-m", "specdec_cli.serve_cli", "serve", "--config", str(path)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert out.stderr.strip() == (
        f"specdec: error: security.api_tokens_file: {tmp_path}/absent-tokens is not a readable file")
