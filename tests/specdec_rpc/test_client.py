"""The Python clients: requests built from keywords, deadlines, retry on UNAVAILABLE only
(and never for a stream that already yielded), health as a status name."""

import asyncio
from concurrent import futures

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from specdec_rpc.client import AsyncSpecdecClient, SpecdecClient, build_request
from specdec_rpc.v1 import specdec_pb2 as pb
from specdec_rpc.v1 import specdec_pb2_grpc


class FlakyServicer(specdec_pb2_grpc.SpeculativeDecodingServicer, health_pb2_grpc.HealthServicer):
    """Fails the first `failures` calls with `code`; streams fail after `fail_after` chunks."""

    def __init__(self) -> None:
        self.failures = 0
        self.code = grpc.StatusCode.UNAVAILABLE
        self.fail_after: int | None = None
        self.calls = 0

    def _maybe_fail(self, context) -> None:
        self.calls += 1
        if self.failures:
            self.failures -= 1
            context.abort(self.code, "not now")

    def Generate(self, request, context):
        self._maybe_fail(context)
        return pb.GenerateResponse(text=request.prompt.upper(), finish_reason="length")

    def GenerateStream(self, request, context):
        self._maybe_fail(context)
        for i, ch in enumerate(request.prompt):
            if self.fail_after is not None and i == self.fail_after:
                context.abort(grpc.StatusCode.UNAVAILABLE, "lost the worker")
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
    servicer.failures, servicer.code, servicer.fail_after, servicer.calls = 0, grpc.StatusCode.UNAVAILABLE, None, 0
    return servicer, address


def test_build_request_fills_every_field():
    request = build_request("p", max_new_tokens=5, temperature=0.7, top_k=3, top_p=0.9, seed=4, mode="on",
                            gamma=6, proposer="ngram", stop=["\n"])
    assert request.prompt == "p" and request.max_new_tokens == 5 and list(request.stop) == ["\n"]
    assert request.sampling.HasField("top_p") and request.sampling.seed == 4 and request.sampling.top_k == 3
    assert (request.speculation.mode, request.speculation.gamma, request.speculation.proposer) == (
        pb.SPECULATION_MODE_ON, 6, pb.PROPOSER_KIND_NGRAM)
    unset = build_request(prompt_token_ids=[1, 2]).sampling
    assert not unset.HasField("top_p") and not unset.HasField("seed")
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
