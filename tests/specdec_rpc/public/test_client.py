"""The Python clients: requests built from keywords, deadlines, retry on UNAVAILABLE only
(and never for a stream that already yielded), Ray Serve's INTERNAL for a dead router
replica read as UNAVAILABLE, health as a status name."""

import asyncio
from concurrent import futures

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from specdec_rpc.public.client import AsyncSpecdecClient, SpecdecClient, build_request
from specdec_rpc.v1 import specdec_pb2 as pb
from specdec_rpc.v1 import specdec_pb2_grpc


class FlakyServicer(specdec_pb2_grpc.SpeculativeDecodingServicer, health_pb2_grpc.HealthServicer):
    """Fails the first `failures` calls with (`code`, `details`); streams fail after
    `fail_after` chunks with (`stream_code`, `stream_details`)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.failures, self.calls, self.fail_after = 0, 0, None
        self.code, self.details = grpc.StatusCode.UNAVAILABLE, "not now"
        self.stream_code, self.stream_details = grpc.StatusCode.UNAVAILABLE, "lost the worker"

    def _maybe_fail(self, context) -> None:
        self.calls += 1
        if self.failures:
            self.failures -= 1
            context.abort(self.code, self.details)

    def Generate(self, request, context):
        self._maybe_fail(context)
        return pb.GenerateResponse(text=request.prompt.upper(), finish_reason="length")

    def GenerateStream(self, request, context):
        self._maybe_fail(context)
        for i, ch in enumerate(request.prompt):
            if self.fail_after is not None and i == self.fail_after:
                context.abort(self.stream_code, self.stream_details)
            yield pb.GenerateChunk(text=ch)

    def Check(self, request, context):
        self._maybe_fail(context)
        return health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)


@pytest.fixture(scope="module")
def server():
    servicer = FlakyServicer()
    grpc_server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    specdec_pb2_grpc.add_SpeculativeDecodingServicer_to_server(servicer, grpc_server)
    health_pb2_grpc.add_HealthServicer_to_server(servicer, grpc_server)
    port = grpc_server.add_insecure_port("127.0.0.1:0")
    grpc_server.start()
    yield servicer, f"127.0.0.1:{port}"
    grpc_server.stop(None)


@pytest.fixture
def flaky(server):
    servicer, address = server
    servicer.reset()
    return servicer, address


#: what Ray Serve's gRPC proxy sends (with INTERNAL) for a call whose replica was killed (Ray 2.60)
REPLICA_DIED = (
    "The actor died unexpectedly before finishing this task.\n\tclass_name: ServeReplica:specdec:SpecdecRouter\n"
    "\tactor_id: 4b7fa6e25786e9e7f031b3e801000000\n\tpid: 29158\n"
    "\tname: SERVE_REPLICA::specdec#SpecdecRouter#24pwwv5v\n"
    "\tnamespace: serve\n\tip: 192.0.2.2\nThe actor is dead because its worker process has died."
)


def test_build_request_fills_every_field():
    request = build_request("p", max_new_tokens=5, temperature=0.7, top_k=3, top_p=0.9, seed=4, mode="on",
                            gamma=6, proposer="ngram", stop=["\n"])
    assert request.prompt == "p" and request.max_new_tokens == 5 and list(request.stop) == ["\n"]
    assert request.sampling.HasField("top_p") and request.sampling.seed == 4 and request.sampling.top_k == 3
    assert (request.speculation.mode, request.speculation.gamma, request.speculation.proposer) == (
        pb.SPECULATION_MODE_ON, 6, pb.PROPOSER_KIND_NGRAM)
    unset = build_request(prompt_token_ids=[1, 2])
    assert not unset.sampling.HasField("top_p") and not unset.sampling.HasField("seed")
    assert not unset.HasField("prompt_logprobs") and not unset.score_only
    scoring = build_request("p", prompt_logprobs=2, score_only=True)
    assert scoring.prompt_logprobs == 2 and scoring.score_only
    with pytest.raises(ValueError, match="mode"):
        build_request("p", mode="sometimes")


def test_unavailable_is_retried_with_backoff(flaky):
    servicer, address = flaky
    servicer.failures = 2
    with SpecdecClient(address, retries=3, backoff_s=0.01) as client:
        assert client.generate("abc").text == "ABC"
    assert servicer.calls == 3


def test_retries_run_out(flaky):
    servicer, address = flaky
    servicer.failures = 5
    with SpecdecClient(address, retries=1, backoff_s=0.01) as client, pytest.raises(grpc.RpcError) as info:
        client.generate("abc")
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE and servicer.calls == 2


def test_other_codes_are_not_retried(flaky):
    servicer, address = flaky
    servicer.failures, servicer.code = 1, grpc.StatusCode.INVALID_ARGUMENT
    with SpecdecClient(address, backoff_s=0.01) as client, pytest.raises(grpc.RpcError) as info:
        client.generate("abc")
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and servicer.calls == 1


def test_a_stream_is_retried_only_before_its_first_chunk(flaky):
    servicer, address = flaky
    servicer.failures = 1
    with SpecdecClient(address, backoff_s=0.01) as client:
        assert "".join(c.text for c in client.generate_stream("abc")) == "abc"
        servicer.fail_after, servicer.calls = 1, 0
        with pytest.raises(grpc.RpcError):
            list(client.generate_stream("abc"))
    assert servicer.calls == 1


def test_the_deadline_applies_per_call():
    with SpecdecClient("127.0.0.1:1", timeout_s=0.2, retries=0) as client, pytest.raises(grpc.RpcError) as info:
        client.generate("abc")
    assert info.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


def test_health_returns_the_status_name(flaky):
    with SpecdecClient(flaky[1]) as client:
        assert client.health() == "SERVING"


def test_the_async_client_retries_and_streams(flaky):
    servicer, address = flaky

    async def main():
        async with AsyncSpecdecClient(address, backoff_s=0.01) as client:
            servicer.failures = 1
            text = (await client.generate("xy")).text
            servicer.failures = 1
            chunks = [c.text async for c in client.generate_stream("xy")]
            return text, chunks, await client.health()

    assert asyncio.run(main()) == ("XY", ["x", "y"], "SERVING")
    assert servicer.calls == 5


def test_a_call_whose_replica_died_is_retried_as_unavailable(flaky):
    servicer, address = flaky
    servicer.failures, servicer.code, servicer.details = 1, grpc.StatusCode.INTERNAL, REPLICA_DIED
    with SpecdecClient(address, retries=3, backoff_s=0.01) as client:
        assert client.generate("abc").text == "ABC"
    assert servicer.calls == 2


def test_a_stream_whose_replica_died_after_yielding_fails_with_unavailable(flaky):
    servicer, address = flaky
    servicer.fail_after, servicer.stream_code, servicer.stream_details = 1, grpc.StatusCode.INTERNAL, REPLICA_DIED
    chunks = []
    with SpecdecClient(address, backoff_s=0.01) as client, pytest.raises(grpc.RpcError) as info:
        for chunk in client.generate_stream("abc"):
            chunks.append(chunk.text)
    assert chunks == ["a"] and servicer.calls == 1
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE and "replica" in info.value.details()
    assert info.value.original.code() == grpc.StatusCode.INTERNAL


@pytest.mark.parametrize("details", ["KeyError: 'x'", "a model worker failed (INTERNAL: The actor died unexpectedly)"])
def test_other_internal_errors_stay_internal_and_are_not_retried(flaky, details):
    servicer, address = flaky
    servicer.failures, servicer.code, servicer.details = 1, grpc.StatusCode.INTERNAL, details
    with SpecdecClient(address, backoff_s=0.01) as client, pytest.raises(grpc.RpcError) as info:
        client.generate("abc")
    assert info.value.code() == grpc.StatusCode.INTERNAL and info.value.details() == details
    assert servicer.calls == 1


def test_the_async_client_reads_a_dead_replica_as_unavailable(flaky):
    servicer, address = flaky

    async def main():
        async with AsyncSpecdecClient(address, backoff_s=0.01, retries=0) as client:
            servicer.failures, servicer.code, servicer.details = 1, grpc.StatusCode.INTERNAL, REPLICA_DIED
            with pytest.raises(grpc.RpcError) as info:
                await client.generate("xy")
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        async with AsyncSpecdecClient(address, backoff_s=0.01) as client:
            servicer.failures = 1
            return [c.text async for c in client.generate_stream("xy")]

    assert asyncio.run(main()) == ["x", "y"]
    assert servicer.calls == 3


@pytest.mark.parametrize("make", [SpecdecClient, AsyncSpecdecClient])
@pytest.mark.parametrize("settings, message", [
    ({"timeout_s": 0}, "timeout_s must be > 0 seconds, or None for no deadline; got 0"),
    ({"timeout_s": -1.0}, "timeout_s must be > 0 seconds"),
    ({"backoff_s": -0.1}, "backoff_s must be >= 0 seconds, got -0.1"),  # else a ValueError at the first retry
])
def test_a_deadline_or_backoff_that_cannot_work_is_refused_when_the_client_is_made(make, settings, message):
    with pytest.raises(ValueError, match=message):
        make("127.0.0.1:1", **settings)


def test_a_zero_deadline_for_one_call_is_refused_before_it_is_sent(flaky):
    servicer, address = flaky
    with SpecdecClient(address, timeout_s=None) as client, pytest.raises(ValueError, match="timeout_s must be > 0"):
        client.generate("abc", timeout_s=0)
    assert servicer.calls == 0
