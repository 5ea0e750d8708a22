"""`kill -TERM` of `specdec serve` under streams (what Kubernetes, systemd and `docker stop`
send): the routers drain (streams finish, or end with gRPC UNAVAILABLE / an SSE error event
when the grace period runs out), the process exits 0 within the grace period plus the
teardown, and no process of its tree is left. scripts/sigterm_check.py is the harness (its
--runs loop repeats this while placing, idle and under 8 streams)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from sigterm_check import one_run  # noqa: E402

pytestmark = pytest.mark.slow
GRACE_S = 3.0
TEARDOWN_S = 30.0  # Serve, the workers, Ray and redis-server after the drain (~10 s on 2 cores)


def test_sigterm_under_streams_drains_exits_0_and_leaves_no_process():
    run = one_run("streams", streams=4, tokens=300, grace_s=GRACE_S)
    assert run.exit_code == 0
    assert run.exit_s < GRACE_S + TEARDOWN_S, f"took {run.exit_s:.1f}s"
    assert len(run.outcomes) == 4 and set(run.outcomes) <= {"finished", "unavailable"}, run.outcomes
    assert run.tree > 3, "the tree was collected (Ray, its workers, redis-server)"
    assert run.left == [], "no process of its tree is left"
    print(f"\nSIGTERM under 4 streams: exit 0 in {run.exit_s:.1f}s, streams {run.outcomes}, tree of {run.tree}")
