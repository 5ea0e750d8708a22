"""WorkerClient: what the router's clients of a worker share (RemoteProposer, RemoteVerifier).

One client talks to one worker (a DraftWorker or the target group's leader) for one router:

* the channel and stub, presenting the cluster's internal secret on every call;
* the router's lease: every call carries its id and renews it, a LeaseRenewer sends a
  KeepAlive when the client has been silent (see worker.proto);
* the HistorySender, whose sequence ids travel in the lease's namespace (its id is their
  prefix), so routers that number their sequences alike never share worker state;
* the release buffer: `release()` is buffered, sent before the next call or by `flush()`;
* the round stream: every round's call (Propose, Verify) travels on one persistent stream
  (RoundStream), opened again on the current channel after it ended; gRPC's channel thread
  answers each call as it parses the call's response (RoundStream's `parse`);
* the WorkerReconnector that looks for the worker again after it went down: `_probe` opens a
  channel to an address and asks GetInfo, `_switch_to` makes the client use it.

What a client does while its worker is down differs (the draft's rounds go on without
drafts, the target's round waits for a new target): the subclass says it in
`_switched_to`, `_holds_releases` and around these calls.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

import grpc
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass

from specdec_rpc.worker.history_sync import HistorySender
from specdec_rpc.worker.internal_auth import secret_channel
from specdec_rpc.worker.lease_renewer import LeaseRenewer, new_lease_id
from specdec_rpc.worker.round_stream import RoundStream
from specdec_rpc.v1 import worker_pb2
from specdec_rpc.worker.worker_reconnector import WorkerReconnector
from specdec_rpc.worker.worker_server import CHANNEL_OPTIONS


@dataclass(frozen=True)
class StreamMethod:
    """A round stream's method as worker.proto declares it: its gRPC path and message classes."""

    path: str  # "/<package>.<service>/<method>"
    request: type[Message]
    response: type[Message]

    @classmethod
    def of(cls, service: str, method: str) -> StreamMethod:
        """``service``'s ``method`` in worker.proto (KeyError for a name it does not declare)."""
        found = worker_pb2.DESCRIPTOR.services_by_name[service].methods_by_name[method]
        return cls(f"/{found.containing_service.full_name}/{found.name}",
                   GetMessageClass(found.input_type), GetMessageClass(found.output_type))


class WorkerClient:
    """The channel, lease, history sender, release buffer and reconnector of one worker client."""

    stub_class: type  # worker_pb2_grpc.DraftWorkerStub or TargetWorkerStub
    round_stream: StreamMethod  # DraftWorker's ProposeStream or TargetWorker's VerifyStream

    def __init__(
        self,
        address: str,
        timeout_s: float,
        lease_id: str | None,
        resolve: Callable[[], str | None] | None,
        secret: str | None,
    ) -> None:
        """address: the worker's host:port; timeout_s: the longest any call may run; lease_id:
        the router's lease (None = a new one); resolve: the worker's current address after it
        went down (None = the same address); secret: the cluster's internal secret (None: none).
        The lease is renewed once the subclass knows its TTL (`_renew_lease`)."""
        self.address = address
        self.secret = secret  # presented on every call
        self.timeout_s = timeout_s
        self._channel = secret_channel(address, secret, CHANNEL_OPTIONS)
        self._stub = self.stub_class(self._channel)
        self._lock = threading.Lock()  # the reconnector's thread swaps the channel; gRPC's re-buffers releases
        self._found: grpc.Channel | None = None  # the probed channel, until _switch_to uses it
        self.reconnector = WorkerReconnector(resolve or (lambda: self.address), self._probe, self._switch_to)
        self._lease_id = lease_id or new_lease_id()
        self._sender = HistorySender(namespace=f"{self._lease_id}/")
        self._released: list[str] = []  # wire ids whose Release is not sent yet
        self.last_compute_s = 0.0  # the worker's compute in the last round's call (RoundProfile)
        self._rounds = RoundStream(self._open_round_stream, timeout_s, parse=self._parse_round_response)

    def _open_round_stream(self, requests, deserialize):
        """The round stream's call on the current channel, its responses parsed by `deserialize`
        (which answers the waiting calls: RoundStream's `parse`)."""
        method = self._channel.stream_stream(self.round_stream.path,
                                             request_serializer=self.round_stream.request.SerializeToString,
                                             response_deserializer=deserialize)
        return method(requests)

    def _parse_round_response(self, data: bytes):
        """(gRPC's channel thread) One response of the round stream, parsed."""
        return self.round_stream.response.FromString(data)

    def _renew_lease(self, ttl_s: float) -> None:
        """Start keeping the lease alive; ttl_s is assumed until the worker states its own."""
        self.lease = LeaseRenewer(self._lease_id, self._keep_alive, ttl_s).start()

    def _keep_alive(self, lease_id: str) -> float:
        """One KeepAlive (from the LeaseRenewer's thread); returns the worker's lease TTL."""
        request = worker_pb2.KeepAliveRequest(lease_id=lease_id)
        return self._stub.KeepAlive(request, timeout=min(self.timeout_s, self.lease.period_s)).lease_ttl_s

    @property
    def probe_timeout_s(self) -> float:
        """How long a probe waits for the worker's GetInfo."""
        raise NotImplementedError

    def _probe(self, address: str) -> None:
        """The reconnector's probe: a GetInfo on a new channel; keeps the channel when it answers."""
        channel = secret_channel(address, self.secret, CHANNEL_OPTIONS)
        try:
            self.stub_class(channel).GetInfo(worker_pb2.InfoRequest(), timeout=self.probe_timeout_s)
        except BaseException:
            channel.close()
            raise
        self._found = channel

    def _switch_to(self, address: str) -> None:
        """A worker answers at `address` again (the reconnector's thread): use the probed channel."""
        with self._lock:
            old, self._channel = self._channel, self._found
            self._stub = self.stub_class(self._channel)
            self.address = address
            self._switched_to(address)
        if old is not self._channel:
            self._rounds.reset()  # the next round opens its stream on the new channel
            old.close()

    def _switched_to(self, address: str) -> None:
        """Under the lock, after the channel swap: what the subclass resets for the new worker."""

    def release(self, seq_id: str) -> None:
        """Forget what was sent of the sequence; its Release is buffered (sent with the next
        call or flush())."""
        self._sender.reset([seq_id])
        with self._lock:
            self._released.append(self._sender.wire_id(seq_id))

    def _holds_releases(self) -> bool:
        """Under the lock: True while buffered releases wait (for a worker that answers)."""
        return False

    def _take_releases(self) -> list[str]:
        """The buffered wire ids, now taken out of the buffer (none while they are held)."""
        if not self._released:
            return []
        with self._lock:
            if self._holds_releases():
                return []
            seq_ids, self._released = self._released, []
        return seq_ids

    def _keep_releases(self, seq_ids: list[str]) -> None:
        """Buffer again the ids of a Release (or a round call carrying them) that failed: sent
        again with the next call."""
        if not seq_ids:
            return
        with self._lock:
            self._released.extend(seq_ids)

    def _release_request(self, seq_ids: list[str]) -> worker_pb2.ReleaseRequest:
        """The Release call of the given wire ids (it renews the lease)."""
        self.lease.touch()
        return worker_pb2.ReleaseRequest(seq_ids=seq_ids, lease_id=self.lease.lease_id)

    def flush(self):
        """Send buffered releases now."""
        raise NotImplementedError

    def info(self) -> worker_pb2.WorkerInfo:
        """The worker's WorkerInfo (after sending buffered releases); raises grpc.RpcError when
        unreachable. Waits up to timeout_s (not on a round's path)."""
        self.flush()
        return self._stub.GetInfo(worker_pb2.InfoRequest(), timeout=self.timeout_s)

    def close(self) -> None:
        """Send buffered releases (best effort), stop renewing the lease, close the channel."""
        self.reconnector.close()
        try:
            self.flush()
        except grpc.RpcError:
            pass
        self.lease.close()
        self._rounds.close()
        self._channel.close()
