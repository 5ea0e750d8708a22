"""`specdec serve` end to end in a subprocess: one ready line, the client subcommands work
against it, and SIGINT shuts everything down with exit status 0."""

from __future__ import annotations

import ipaddress
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from actors.app import free_port
from specdec_cli.serve_cli import main

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import worker_intruder  # noqa: E402

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
def server(tmp_path_factory):
    port = free_port()
    stderr = (tmp_path_factory.mktemp("serve") / "stderr").open("w+")
    process = subprocess.Popen(
        [sys.executable, "-m", "specdec_cli.serve_cli", "serve", "--port", str(port), "--http-port", str(free_port())],
        stdout=subprocess.PIPE, stderr=stderr, text=True,
    )
    process.stderr_file = stderr
    try:
        yield process, port, read_ready_line(process, READY_TIMEOUT_S)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        stderr.close()


def test_serve_prints_one_ready_line(server):
    _, port, line = server
    assert line.startswith(f"specdec serving on 0.0.0.0:{port} (target tp=1, draft ready, ")
    # the embedded default shares its load measurements through a local redis-server when installed
    assert ("local redis-server redis://127.0.0.1:" in line) == (shutil.which("redis-server") is not None)


def test_start_up_says_what_it_is_doing(server):
    process, _, _ = server
    process.stderr_file.seek(0)
    stages = [line for line in process.stderr_file.read().splitlines() if line.startswith("specdec serve: ")]
    assert stages[0] == "specdec serve: starting Ray (or using this process's) ..."
    assert stages[1].startswith("specdec serve: placing and loading the target (bundled:target, 1 shard(s), ")
    assert "and the draft (bundled:draft)" in stages[1]
    assert stages[2].startswith("specdec serve: starting Serve's gRPC and HTTP proxies")


def test_client_health_and_generate_against_the_server(server, capsys, tokenizer, hf_greedy):
    _, port, _ = server
    assert main(["client", "health", "--server", f"127.0.0.1:{port}"]) == 0
    assert capsys.readouterr().out == "SERVING\n"
    prompt = "def parse(line):"
    args = ["client", "generate", "--server", f"127.0.0.1:{port}", "--prompt", prompt, "--max-new-tokens", "12",
            "--json"]
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
    rows = ("speculation", "gamma (AUTO requests)", "acceptance rate α", "round cost (ms)", "speculation pays below")
    for row in rows:
        assert row in table
    assert main(["status", "--server", f"127.0.0.1:{port}", "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert int(stats["rounds"]) > 0 and stats["measurements_source"] in ("shared", "local")
    qps = "QPS (cluster)" if stats["measurements_source"] == "shared" else "QPS (this replica only)"
    assert qps in table, "local measurements are never labelled the cluster's"


def test_its_workers_listen_on_loopback_only_and_refuse_calls_without_the_secret(server):
    """No secret configured: `specdec serve` generated one; a process without it (this one)
    finds both workers on loopback and has every direct call refused."""
    process, _, _ = server
    sockets = worker_intruder.worker_sockets(process.pid)
    assert sorted(kind for *_, kind in sockets) == ["draft", "target"]
    for ip, _, _ in sockets:
        address = ipaddress.ip_address(ip)
        assert (getattr(address, "ipv4_mapped", None) or address).is_loopback, f"a worker listens on {ip}"
    answers = worker_intruder.intrude(sockets, 60)
    assert sum(answers.values()) == 60 and worker_intruder.accepted(answers) == 0, answers


def test_sigint_shuts_down_cleanly(server):
    process, _, _ = server
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=120) == 0


def session_processes(sid: int, settle_s: float = 10.0) -> list[str]:
    """Processes still alive in the session the server was started in (ps: pid, command),
    after giving exiting ones (e.g. a resource tracker that sees its pipe close) settle_s."""
    deadline = time.monotonic() + settle_s
    while True:
        out = subprocess.run(["ps", "-eo", "pid=,sid=,stat=,args="], capture_output=True, text=True).stdout
        rows = [line.split(None, 3) for line in out.splitlines()]
        alive = [f"{r[0]} {r[3] if len(r) > 3 else ''}" for r in rows
                 if len(r) >= 3 and int(r[1]) == sid and "Z" not in r[2]]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.2)


def unschedulable_serve(tmp_path, placement_timeout_s: float) -> subprocess.Popen:
    """`specdec serve --tensor-parallel-size 2` asking 64 CPUs per rank: never schedulable here."""
    config = tmp_path / "huge.yaml"
    config.write_text(f"serving:\n  target_num_cpus: 64\n  placement_timeout_s: {placement_timeout_s}\n")
    return subprocess.Popen(
        [sys.executable, "-m", "specdec_cli.serve_cli", "serve", "--port", str(free_port()),
         "--http-port", str(free_port()),
         "--tensor-parallel-size", "2", "--config", str(config)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )


def test_an_unschedulable_start_fails_in_bounded_time_naming_what_is_missing(tmp_path):
    process = unschedulable_serve(tmp_path, placement_timeout_s=3)
    try:
        _, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == 1, err
    [line] = [line for line in err.splitlines() if line.startswith("specdec serve: failed to start:")]
    assert "placement group could not be scheduled within 3s" in line
    assert "needs 2 x {'CPU': 64.0} = {'CPU': 128.0} on one node" in line and "node(s) have [{'CPU': " in line
    assert session_processes(process.pid) == [], "nothing it started is left behind"


def test_sigint_while_waiting_for_resources_stops_everything_within_seconds(tmp_path):
    process = unschedulable_serve(tmp_path, placement_timeout_s=300)
    try:
        selector = selectors.DefaultSelector()
        selector.register(process.stderr, selectors.EVENT_READ)
        deadline, waiting = time.monotonic() + 120, ""
        while not waiting and time.monotonic() < deadline and process.poll() is None:
            if selector.select(timeout=1.0):
                line = process.stderr.readline()
                waiting = line if "still waiting for the target group's placement group" in line else ""
        assert "needs 2 x {'CPU': 64.0}" in waiting, "progress is logged, naming what is missing"
        process.send_signal(signal.SIGINT)
        sent = time.monotonic()
        process.wait(timeout=60)
        stopped_s = time.monotonic() - sent
        _, err = process.communicate(timeout=60)  # returns once every child that shares its stderr is gone
        all_gone_s = time.monotonic() - sent
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == 0, err  # a stop asked for and done
    assert "stopped by SIGINT while starting" in err
    assert all_gone_s < 30, f"took {all_gone_s:.0f}s"
    print(f"\nSIGINT while waiting for resources -> exited in {stopped_s:.1f}s, all children gone in {all_gone_s:.1f}s")
    assert session_processes(process.pid) == [], "nothing it started is left behind"
