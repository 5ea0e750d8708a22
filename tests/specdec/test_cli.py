"""`specdec generate` on the bundled pair: text or one JSON object; bad input exits 2 naming the field."""

import json
import subprocess
import sys

import pytest

from specdec.cli import main


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
        code, out, _ = run_cli(capsys, "--prompt", "import os\n", "--max-new-tokens", "16", "--proposer", proposer, "--json")
        assert code == 0
        texts.add(json.loads(out)["text"])
    assert len(texts) == 1


def test_plain_output_prints_prompt_and_continuation(capsys):
    code, out, _ = run_cli(capsys, "--prompt", "class Foo:", "--max-new-tokens", "4")
    assert code == 0 and out.startswith("class Foo:")


def test_seeded_sampling_is_reproducible(capsys):
    args = ("--prompt", "def f(x):", "--max-new-tokens", "16", "--temperature", "0.9", "--top-p", "0.9", "--seed", "5", "--json")
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
        (["--prompt", "x " * 1500], "prompt"),
    ],
)
def test_bad_input_exits_2_naming_the_field(capsys, args, field):
    code, _, err = run_cli(capsys, *args)
    assert code == 2
    assert field in err and "Traceback" not in err


def test_console_script_is_installed():
    out = subprocess.run([sys.executable, "-m", "specdec.cli", "generate", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "--proposer" in out.stdout
