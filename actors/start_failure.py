"""Why a start failed, in one line: the router replica's own exception, not Serve's summary.

Serve reports a deployment whose replicas fail to start as "Deploying application specdec
failed: Failed to update the deployments [...]"; the replica's exception is only in the
deployment's status message (a remote traceback) and in Ray's log files. A router whose
backend fails to load after its constructor returned (the load runs in a thread) stays
RUNNING for Serve until its health checks fail several times. `serve_failure` reads the
first, `router_load_failure` asks the router for the second, so that a start fails within
seconds naming the cause.
"""

from __future__ import annotations

import re

from ray import serve

ANSI = re.compile(r"\x1b\[[0-9;]*m")
FAILED = ("DEPLOY_FAILED", "UNHEALTHY")
ASK_TIMEOUT_S = 5.0


class StartFailed(RuntimeError):
    """A start that failed; the message is the underlying reason, one line."""


def last_line(message: str) -> str:
    """The last non-empty line of a (remote) traceback: the exception itself."""
    lines = [line.strip() for line in ANSI.sub("", message).splitlines() if line.strip()]
    return lines[-1] if lines else ""


def serve_failure(app_name: str) -> str | None:
    """'<deployment>: <its replica's exception>' for the first failed deployment of
    `app_name`, or None (running, unknown, or Serve not answering)."""
    try:
        app = serve.status().applications.get(app_name)
    except Exception:  # Serve itself is gone: nothing more to say than the caller's error
        return None
    for name, deployment in (app.deployments.items() if app is not None else ()):
        status = getattr(deployment.status, "value", str(deployment.status))
        if status in FAILED and deployment.message:
            return f"{name}: {last_line(deployment.message)}"
    return None


def explained(exc: BaseException, app_name: str) -> BaseException:
    """`exc` (Serve's summary) replaced by StartFailed naming the replica's exception, when
    Serve knows it."""
    reason = serve_failure(app_name)
    return StartFailed(reason) if reason else exc


def router_load_failure(app_name: str) -> str | None:
    """The router's backend load error ('Type: message'), or None while it loads or serves."""
    try:
        return serve.get_app_handle(app_name).load_failure.remote().result(timeout_s=ASK_TIMEOUT_S)
    except Exception:  # not deployed yet, busy, or restarting: readiness polling goes on
        return serve_failure(app_name)
