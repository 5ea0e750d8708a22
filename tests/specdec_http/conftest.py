"""One in-process served engine and its HTTP API (uvicorn on 127.0.0.1) shared by the HTTP
tests of this package that need no special server configuration (a test module that needs one
defines its own `served` / `server`)."""

from __future__ import annotations

import pytest

from openai_http import UvicornThread
from specdec.config.config import load_config
from specdec.serving.frontend import Frontend
from specdec.wiring.engine_builder import build_served_engine
from specdec.wiring.ports import free_port
from specdec_http.http_api import HttpApi, asgi_app

MAX_SEQ_LEN = 256


@pytest.fixture(scope="package")
def served():
    served = build_served_engine(load_config(overrides={"cache": {"num_slots": 4, "max_seq_len": MAX_SEQ_LEN}}))
    yield served
    served.close()


@pytest.fixture(scope="package")
def server(served):
    with UvicornThread(asgi_app(HttpApi(Frontend(served))), free_port()) as server:
        yield server
