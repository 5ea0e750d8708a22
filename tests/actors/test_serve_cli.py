"""`specdec serve` end to end in a subprocess: one ready line, the client subcommands work
against it, and SIGINT shuts everything down with exit status 0."""

from __future__ import annotations

import json
import selectors
import shutil
import signal
import subprocess
import sys
import time

import pytest

from actors.app import free_port
from actors.cli import main

READY_TIMEOUT_S = 300


def read_ready_line(process: subprocess.Popen, timeout_s: float) -> str:
    selector = selectors.DefaultSelector()
    selector.register(process.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and process.poll() is None:
        if selector.select(timeout=1.0):
            return process.stdout.readline()
    raise AssertionError(f"no ready line within {timeout_s}s (exit status {process.poll()})")


@pytest.fixture(scope="module")
def server():
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "actors.cli", "serve", "--port", str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    try:
        yield process, port, read_ready_line(process, READY_TIMEOUT_S)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_serve_prints_one_ready_line(server):
    _, port, line = server
    assert line.startswith(f"specdec serving on 0.0.0.0:{port} (target tp=1, draft ready, ")
    # the embedded default shares its load measurements through a local redis-server when installed
    assert ("local redis-server redis://127.0.0.1:" in line) == (shutil.which("redis-server") is not None)


def test_client_health_and_generate_against_the_server(server, capsys, tokenizer, hf_greedy):
    _, port, _ = server
    assert main(["client", "health", "--server", f"127.0.0.1:{port}"]) == 0
    assert capsys.readouterr().out == "SERVING\n"
    prompt = "def parse(line):"
    args = ["client", "generate", "--server", f"127.0.0.1:{port}", "--prompt", prompt, "--max-new-tokens", "12", "--json"]
    assert main(args) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["token_ids"] == hf_greedy(tokenizer(prompt, add_special_tokens=False)["input_ids"], 12)
    assert result["stats"]["drafted"] > 0 and result["stats"]["rounds"] < 12
    assert main([*args[:-1], "--stream"]) == 0
    assert capsys.readouterr().out == prompt + result["text"] + "\n"
    assert main([*args[:-3], "--temperature", "-1"]) == 2
    assert "INVALID_ARGUMENT: temperature" in capsys.readouterr().err


def test_status_shows_the_live_speculation_picture(server, capsys):
    _, port, _ = server
    assert main(["status", "--server", f"127.0.0.1:{port}"]) == 0
    table = capsys.readouterr().out
    for row in ("speculation", "gamma (AUTO requests)", "acceptance rate α", "round cost (ms)", "speculation pays below", "QPS (cluster)"):
        assert row in table
    assert main(["status", "--server", f"127.0.0.1:{port}", "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert int(stats["rounds"]) > 0 and stats["measurements_source"] in ("shared", "local")


def test_sigint_shuts_down_cleanly(server):
    process, _, _ = server
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=120) == 0
