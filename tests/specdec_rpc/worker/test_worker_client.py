"""WorkerClient, the base of both worker clients (no model; a fake worker on 127.0.0.1):
releases wait in a buffer, in the lease's namespace, until taken once (or while the
subclass holds them; a failed Release puts them back); a probe keeps a channel only where
a worker answers, and a switch makes the client use it; each client's round stream, read from
worker.proto, is the call the generated stub makes."""

from __future__ import annotations

import grpc
import pytest

from specdec.wiring.ports import free_port
from specdec_metrics.worker_metrics import WorkerMetrics, WorkerState
from specdec_rpc.v1 import worker_pb2, worker_pb2_grpc
from specdec_rpc.worker.remote_proposer import RemoteProposer
from specdec_rpc.worker.remote_verifier import RemoteVerifier
from specdec_rpc.worker.worker_client import StreamMethod, WorkerClient
from specdec_rpc.worker.worker_server import ServerThread
from specdec_rpc.worker.worker_servicer import WorkerServicer


class Client(WorkerClient):
    stub_class = worker_pb2_grpc.DraftWorkerStub
    probe_timeout_s = 5.0

    def __init__(self, address: str) -> None:
        super().__init__(address, timeout_s=5.0, lease_id="L", resolve=None, secret=None)
        self._renew_lease(30.0)
        self.holding = False
        self.switched: list[str] = []

    def _holds_releases(self) -> bool:
        return self.holding

    def _switched_to(self, address: str) -> None:
        self.switched.append(address)

    def flush(self) -> None:
        pass


class Draft(WorkerServicer, worker_pb2_grpc.DraftWorkerServicer):
    """A worker that only answers GetInfo."""

    def __init__(self) -> None:
        super().__init__("probed-worker", 30.0, WorkerMetrics.off("draft"))

    def state(self) -> WorkerState:
        return WorkerState(0, 0, 0, 0, 0)

    def info(self) -> worker_pb2.WorkerInfo:
        return self._info(model="found")


@pytest.fixture
def client():
    client = Client(f"127.0.0.1:{free_port()}")  # nothing serves there
    yield client
    client.close()


def test_releases_wait_in_the_lease_namespace_until_taken_once(client):
    client.release("a")
    client.release("b")
    client.holding = True
    assert client._take_releases() == []
    client.holding = False
    assert client._take_releases() == ["L/a", "L/b"]
    assert client._take_releases() == []
    client._keep_releases(["L/a"])  # its Release failed
    request = client._release_request(client._take_releases())
    assert (list(request.seq_ids), request.lease_id) == (["L/a"], "L")


def test_a_probe_keeps_a_channel_only_where_a_worker_answers_and_a_switch_uses_it(client):
    with pytest.raises(grpc.RpcError):
        client._probe(client.address)
    assert client._found is None
    with ServerThread(Draft()) as server:
        client._probe(server.address)
        client._switch_to(server.address)
        assert (client.address, client.switched) == (server.address, [server.address])
        assert client._stub.GetInfo(worker_pb2.InfoRequest(), timeout=5).model == "found"


class RecordingChannel:
    """What a generated stub registers on its channel: path -> (kind, serializer, deserializer)."""

    def __init__(self) -> None:
        self.methods: dict[str, tuple] = {}

    def __getattr__(self, kind: str):
        def register(path, request_serializer=None, response_deserializer=None, **_):
            self.methods[path] = (kind, request_serializer, response_deserializer)
        return register


@pytest.mark.parametrize("client_class", [RemoteProposer, RemoteVerifier])
def test_the_round_stream_read_from_the_proto_is_the_stream_the_generated_stub_calls(client_class):
    channel = RecordingChannel()
    client_class.stub_class(channel)
    stream = client_class.round_stream
    assert channel.methods[stream.path] == ("stream_stream", stream.request.SerializeToString,
                                            stream.response.FromString)


def test_a_stream_method_worker_proto_does_not_declare_is_refused():
    with pytest.raises(KeyError):
        StreamMethod.of("DraftWorker", "VerifyStream")
