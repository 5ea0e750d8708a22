"""Plain-HTTP helpers for the OpenAI-compatible API tests (what the official client hides:
the raw server-sent events, and a connection the test can drop mid-stream)."""

from __future__ import annotations

import contextlib
import http.client
import json
import threading
import time
from urllib.parse import urlparse


def post(base_url: str, path: str, body: dict, timeout_s: float = 120.0) -> tuple[int, dict]:
    """(status, JSON body) of a POST."""
    conn = _connect(base_url, timeout_s)
    try:
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def post_raw(base_url: str, path: str, body: str | bytes, timeout_s: float = 120.0) -> tuple[int, dict]:
    """(status, JSON body) of a POST of bytes as they are (what json.dumps would not write)."""
    conn = _connect(base_url, timeout_s)
    try:
        conn.request("POST", path, body, {"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def get(base_url: str, path: str, timeout_s: float = 30.0) -> tuple[int, dict]:
    conn = _connect(base_url, timeout_s)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def sse_lines(base_url: str, path: str, body: dict, timeout_s: float = 120.0) -> list[str]:
    """Every `data: ...` payload of a streamed response, in order ([DONE] included)."""
    conn = _connect(base_url, timeout_s)
    try:
        conn.request("POST", path, json.dumps({**body, "stream": True}), {"Content-Type": "application/json"})
        response = conn.getresponse()
        assert response.status == 200 and response.getheader("content-type").startswith("text/event-stream")
        return [line[len("data: "):] for line in response.read().decode().split("\n\n") if line.startswith("data: ")]
    finally:
        conn.close()


class OpenStream:
    """A streamed request whose first event has arrived; `drop()` closes the connection
    without reading on (the client going away)."""

    def __init__(self, base_url: str, path: str, body: dict) -> None:
        self.conn = _connect(base_url, 120.0)
        self.conn.request("POST", path, json.dumps({**body, "stream": True}), {"Content-Type": "application/json"})
        self.response = self.conn.getresponse()
        assert self.response.status == 200, self.response.read()
        self.first = self.response.readline()
        assert self.first.startswith(b"data: {"), self.first

    def drop(self) -> None:
        self.conn.sock.shutdown(2) if self.conn.sock is not None else None
        self.conn.close()


class OpenUnary:
    """A unary request sent without waiting for its answer; `drop()` closes the connection."""

    def __init__(self, base_url: str, path: str, body: dict) -> None:
        self.conn = _connect(base_url, 120.0)
        self.conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})

    def drop(self) -> None:
        self.conn.sock.shutdown(2) if self.conn.sock is not None else None
        self.conn.close()


def wait_until(condition, timeout_s: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def _connect(base_url: str, timeout_s: float) -> http.client.HTTPConnection:
    url = urlparse(base_url)
    return http.client.HTTPConnection(url.hostname, url.port, timeout=timeout_s)


class UvicornThread:
    """An ASGI app served by uvicorn on 127.0.0.1 in a background thread."""

    def __init__(self, app, port: int) -> None:
        import uvicorn

        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.url = f"http://127.0.0.1:{port}"

    def __enter__(self) -> "UvicornThread":
        self.thread.start()
        assert wait_until(lambda: self.server.started, 30.0), "uvicorn did not start"
        return self

    def __exit__(self, *exc_info) -> None:
        self.server.should_exit = True
        self.thread.join(10)


@contextlib.contextmanager
def served_http(overrides: dict):
    """The HTTP API on in-process bundled models built with config `overrides`, on a free
    127.0.0.1 port (closed, engine and all, on exit)."""
    from specdec.config.config import load_config
    from specdec.serving.frontend import Frontend
    from specdec.wiring.engine_builder import build_served_engine
    from specdec.wiring.ports import free_port
    from specdec_http.http_api import HttpApi, asgi_app

    served = build_served_engine(load_config(overrides=overrides))
    try:
        with UvicornThread(asgi_app(HttpApi(Frontend(served))), free_port()) as server:
            yield server
    finally:
        served.close()
