"""Draining a frontend before the server stops (specdec/serving/drain.py): from the drain's start new
requests are refused as unavailable and health reports it; requests in flight finish when
the grace period allows, else they end as unavailable (EngineClosedError), never hang; the
engine loop is stopped (its slots freed); a second drain waits for the first."""

from __future__ import annotations

import asyncio

import pytest

from specdec.serving.async_engine import EngineClosedError
from specdec.config.config import load_config
from specdec.serving.drain import SHUTTING_DOWN, Drain
from specdec.wiring.engine_builder import build_served_engine
from specdec.serving.frontend import Frontend
from specdec.serving.serving_errors import ErrorKind, NotReadyError, classify
from specdec.serving.text_request import TextRequest


@pytest.fixture
def frontend():
    served = build_served_engine(load_config(overrides={"cache": {"num_slots": 4, "max_seq_len": 256}}))
    yield Frontend(served)
    served.close()


def request(prompt_ids, tokens: int, rid: str) -> TextRequest:
    return TextRequest(prompt_token_ids=tuple(prompt_ids[0]), max_new_tokens=tokens, request_id=rid)


async def drain_under_streams(frontend: Frontend, prompt_ids, grace_s: float, tokens: int):
    """Two streams running when the drain starts, a third request sent during it; the
    drain's report and what each of the three got."""

    async def stream(rid: str, started: asyncio.Event):
        deltas = []
        try:
            async for delta in frontend.stream(request(prompt_ids, tokens, rid)):
                deltas.append(delta)
                started.set()
            return deltas
        except Exception as exc:
            started.set()
            return exc

    events = [asyncio.Event(), asyncio.Event()]
    tasks = [asyncio.create_task(stream(f"s{i}", e)) for i, e in enumerate(events)]
    await asyncio.gather(*(e.wait() for e in events))
    drain = Drain(frontend)
    draining = asyncio.create_task(drain.run(grace_s))
    await asyncio.sleep(0)
    late = await asyncio.gather(frontend.generate(request(prompt_ids, 4, "late")), return_exceptions=True)
    report, again = await asyncio.gather(draining, drain.run(grace_s))
    return report, again, await asyncio.gather(*tasks), late[0]


def test_in_flight_requests_finish_within_the_grace_period_and_new_ones_are_refused(frontend, prompt_ids):
    report, again, streams, late = asyncio.run(drain_under_streams(frontend, prompt_ids, grace_s=60.0, tokens=24))
    assert [s[-1].finish_reason for s in streams] == ["length", "length"]
    assert sum(len(d.token_ids) for d in streams[0]) == 24
    assert isinstance(late, NotReadyError) and SHUTTING_DOWN in str(late) and classify(late) is ErrorKind.UNAVAILABLE
    assert (report.in_flight, report.cancelled) == (2, 0) and again == report
    assert not frontend.is_ready and frontend.problems() == [SHUTTING_DOWN]
    assert not frontend.served.loop.is_running, "the engine loop is stopped: its slots are released"


def test_requests_still_running_after_the_grace_period_end_as_unavailable(frontend, prompt_ids):
    report, _, streams, _ = asyncio.run(drain_under_streams(frontend, prompt_ids, grace_s=0.2, tokens=180))
    assert all(isinstance(s, EngineClosedError) and classify(s) is ErrorKind.UNAVAILABLE for s in streams), streams
    assert (report.in_flight, report.cancelled) == (2, 2)
    assert 0.2 <= report.waited_s < 15


def test_draining_a_server_that_never_loaded_refuses_at_once():
    frontend = Frontend(None)
    report = asyncio.run(Drain(frontend).run(5.0))
    assert (report.in_flight, report.cancelled) == (0, 0)
    with pytest.raises(NotReadyError, match=SHUTTING_DOWN):
        frontend.ready()
