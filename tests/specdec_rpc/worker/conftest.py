"""Fixtures of the remote engine's tests (a module that defines its own `workers` uses its own)."""

from __future__ import annotations

import pytest

from remote_workers import engine_maker, started_workers


@pytest.fixture(scope="module")
def workers():
    """A draft and a target worker on 127.0.0.1, each on its own event loop thread."""
    yield from started_workers()


@pytest.fixture
def remote_engine(workers, tokenizer):
    """make(proposer, gamma) -> an engine whose verifier and draft proposer are gRPC clients."""
    yield from engine_maker(workers, tokenizer)
