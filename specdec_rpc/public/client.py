"""Python clients of the public API: `SpecdecClient` (blocking) and `AsyncSpecdecClient` (grpc.aio).

Every call has a deadline (`timeout_s`, per client and overridable per call; None = no
deadline). Calls that fail with UNAVAILABLE (server starting, restarting, or briefly
unreachable) are retried up to `retries` times with exponential backoff; no other code is
retried, and a stream is retried only while it has not yielded anything. A call whose
router replica died reaches the client as INTERNAL from Ray Serve's proxy; the clients
recognise it and raise (or retry) it as UNAVAILABLE (`replica_loss`).

Security: `token` is sent as `authorization: Bearer <token>` on every call (the server's
`security.api_tokens_file`); `tls_ca_file` connects over TLS, trusting that CA's
certificates ("" = the system's roots; None = plaintext).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any, NoReturn

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from specdec.requests.speculation_mode import SpeculationMode
from specdec_rpc.public.direct_targets import read_list, several_addresses
from specdec_rpc.public.replica_loss import as_unavailable
from specdec_rpc.v1 import specdec_pb2, specdec_pb2_grpc

_UNSET: Any = object()
MODES = {
    SpeculationMode.AUTO: specdec_pb2.SPECULATION_MODE_AUTO,
    SpeculationMode.ON: specdec_pb2.SPECULATION_MODE_ON,
    SpeculationMode.OFF: specdec_pb2.SPECULATION_MODE_OFF,
}
PROPOSERS = {None: specdec_pb2.PROPOSER_KIND_UNSPECIFIED, "draft": specdec_pb2.PROPOSER_KIND_DRAFT,
             "ngram": specdec_pb2.PROPOSER_KIND_NGRAM}
CHANNEL_OPTIONS = [("grpc.max_receive_message_length", 64 * 1024 * 1024)]


def build_request(
    prompt: str | None = None,
    *,
    prompt_token_ids: Sequence[int] | None = None,
    max_new_tokens: int = 0,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float | None = None,
    seed: int | None = None,
    mode: str = "auto",
    gamma: int = 0,
    proposer: str | None = None,
    stop: Sequence[str] = (),
    stop_token_ids: Sequence[int] = (),
    tpot_target_ms: float | None = None,
    grammar: tuple[str, str] | None = None,
    prompt_logprobs: int | None = None,
    score_only: bool = False,
) -> specdec_pb2.GenerateRequest:
    """A GenerateRequest from keyword arguments (0 / None = the server's default).

    mode: "auto" (the server decides), "on" or "off"; proposer: "draft", "ngram" or None;
    tpot_target_ms: the request's time-per-output-token target (None = the server's);
    grammar: (kind, text) the output must match (structured output; None = free text);
    prompt_logprobs: report each prompt token's logprob and this many alternatives;
    score_only: with prompt_logprobs, score the prompt and generate nothing.
    The server validates the values; only unknown mode / proposer names fail here.
    """
    speculation = _speculation_params(mode, gamma, proposer, tpot_target_ms)  # checks the names first
    return specdec_pb2.GenerateRequest(
        prompt=prompt or "",
        prompt_token_ids=list(prompt_token_ids or ()),
        max_new_tokens=max_new_tokens,
        sampling=_sampling_params(temperature, top_k, top_p, seed),
        speculation=speculation,
        stop=list(stop),
        stop_token_ids=list(stop_token_ids),
        grammar=None if grammar is None else specdec_pb2.Grammar(kind=grammar[0], text=grammar[1]),
        prompt_logprobs=prompt_logprobs,
        score_only=score_only,
    )


def _sampling_params(temperature: float, top_k: int, top_p: float | None,
                     seed: int | None) -> specdec_pb2.SamplingParams:
    """top_p, seed None: left unset (the server's default)."""
    sampling = specdec_pb2.SamplingParams(temperature=temperature, top_k=top_k)
    if top_p is not None:
        sampling.top_p = top_p
    if seed is not None:
        sampling.seed = seed
    return sampling


def _speculation_params(mode: str, gamma: int, proposer: str | None,
                        tpot_target_ms: float | None) -> specdec_pb2.SpeculationParams:
    """ValueError for an unknown mode or proposer name; tpot_target_ms None: left unset."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {sorted(m.value for m in MODES)}, got {mode!r}")
    if proposer not in PROPOSERS:
        raise ValueError(f"proposer must be 'draft', 'ngram' or None, got {proposer!r}")
    speculation = specdec_pb2.SpeculationParams(mode=MODES[mode], gamma=gamma, proposer=PROPOSERS[proposer])
    if tpot_target_ms is not None:
        speculation.tpot_target_ms = tpot_target_ms
    return speculation


def is_retryable(exc: BaseException) -> bool:
    """Only UNAVAILABLE is retried (no replica could serve the call: not ready, gone, or it
    died serving it; Serve's INTERNAL for a dead replica counts, see replica_loss)."""
    if not isinstance(exc, grpc.RpcError) or not callable(getattr(exc, "code", None)):
        return False
    return as_unavailable(exc).code() == grpc.StatusCode.UNAVAILABLE


def _raise(exc: grpc.RpcError) -> NoReturn:
    """Raise a failed call's error; a dead replica's INTERNAL as UNAVAILABLE (ReplicaLostError)."""
    error = as_unavailable(exc)
    if error is exc:
        raise exc
    raise error from exc


def _health_name(status: int) -> str:
    return health_pb2.HealthCheckResponse.ServingStatus.Name(status)


def channel_target(target: str) -> tuple[str, list[tuple[str, Any]]]:
    """gRPC's target and channel options for `target`. Several addresses separated by commas (the
    router replicas' own ports, `serving.ingress: direct`, e.g. "127.0.0.1:40000,127.0.0.1:40001")
    are dialled as one channel that spreads calls round-robin over those that answer; host names
    are resolved now (blocking: `AsyncSpecdecClient` calls this off its event loop), and a list gRPC
    cannot dial (mixed families, a name that does not resolve) is refused naming its entry
    (`direct_targets`). TLS then checks the certificate against the first entry's host."""
    if "," not in target:
        return target, CHANNEL_OPTIONS
    dialled, authority = several_addresses(target)
    return dialled, [*CHANNEL_OPTIONS, ("grpc.lb_policy_name", "round_robin"), ("grpc.default_authority", authority)]


def check_target(target: str) -> None:
    """Refuse, without resolving a name, a list of addresses that can never be dialled (a
    malformed entry, IP addresses of both families): ValueError naming the entry."""
    if "," in target:
        read_list(target)


def credentials(tls_ca_file: str | None) -> grpc.ChannelCredentials | None:
    """None (plaintext) for tls_ca_file None, else TLS trusting that CA ("" = the system's roots)."""
    if tls_ca_file is None:
        return None
    return grpc.ssl_channel_credentials(Path(tls_ca_file).read_bytes() if tls_ca_file else None)


def open_channel(target: str, tls_ca_file: str | None = None, aio: bool = False) -> Any:
    """A channel to `target` (one address, or several: `channel_target`): plaintext (tls_ca_file
    None) or TLS trusting that CA ("" = the system's roots)."""
    return _dial(channel_target(target), credentials(tls_ca_file), aio)


def _dial(target_options: tuple[str, list[tuple[str, Any]]], creds: grpc.ChannelCredentials | None, aio: bool) -> Any:
    grpc_module = grpc.aio if aio else grpc
    target, options = target_options
    if creds is None:
        return grpc_module.insecure_channel(target, options=options)
    return grpc_module.secure_channel(target, creds, options=options)


def checked_timeout(timeout_s: float | None) -> float | None:
    """A deadline in seconds: > 0, or None for none. 0 is refused rather than read as "no
    deadline" (gRPC would fail the call at once, as DEADLINE_EXCEEDED)."""
    if timeout_s is not None and not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0 seconds, or None for no deadline; got {timeout_s!r}")
    return timeout_s


class _Retrying:
    """Deadline, retry and credential settings shared by both clients."""

    def __init__(self, timeout_s: float | None, retries: int, backoff_s: float, token: str | None = None) -> None:
        if retries < 0:
            raise ValueError(f"retries must be >= 0, got {retries}")
        if not backoff_s >= 0:  # (a negative sleep would fail only at the first retry)
            raise ValueError(f"backoff_s must be >= 0 seconds, got {backoff_s!r}")
        self.timeout_s = checked_timeout(timeout_s)
        self.retries = retries
        self.backoff_s = backoff_s
        self.metadata = (("authorization", f"Bearer {token}"),) if token else None

    def _timeout(self, timeout_s: Any) -> float | None:
        return self.timeout_s if timeout_s is _UNSET else checked_timeout(timeout_s)

    def _delay(self, attempt: int) -> float:
        return self.backoff_s * (2**attempt)


class SpecdecClient(_Retrying):
    """Blocking client: `generate`, `generate_stream`, `health`. Use as a context manager."""

    def __init__(self, target: str, timeout_s: float | None = 60.0, retries: int = 3, backoff_s: float = 0.2,
                 token: str | None = None, tls_ca_file: str | None = None) -> None:
        super().__init__(timeout_s, retries, backoff_s, token)
        self.target = target
        self._channel = open_channel(target, tls_ca_file)
        self._stub = specdec_pb2_grpc.SpeculativeDecodingStub(self._channel)
        self._health = health_pb2_grpc.HealthStub(self._channel)

    def _call(self, method: Any, request: Any, timeout_s: Any) -> Any:
        for attempt in range(self.retries + 1):
            try:
                return method(request, timeout=self._timeout(timeout_s), metadata=self.metadata)
            except grpc.RpcError as exc:
                if attempt == self.retries or not is_retryable(exc):
                    _raise(exc)
                time.sleep(self._delay(attempt))

    def generate(
        self, prompt: str | None = None, *, timeout_s: Any = _UNSET, **fields: Any
    ) -> specdec_pb2.GenerateResponse:
        """The whole result (fields: see build_request)."""
        return self._call(self._stub.Generate, build_request(prompt, **fields), timeout_s)

    def generate_stream(
        self, prompt: str | None = None, *, timeout_s: Any = _UNSET, **fields: Any
    ) -> Iterator[specdec_pb2.GenerateChunk]:
        """Chunks as rounds confirm them; stopping the iteration early cancels the call."""
        request = build_request(prompt, **fields)
        for attempt in range(self.retries + 1):
            call = self._stub.GenerateStream(request, timeout=self._timeout(timeout_s), metadata=self.metadata)
            yielded = False
            try:
                for chunk in call:
                    yielded = True
                    yield chunk
                return
            except grpc.RpcError as exc:
                if yielded or attempt == self.retries or not is_retryable(exc):
                    _raise(exc)
            finally:
                call.cancel()  # no-op once the call completed
            time.sleep(self._delay(attempt))

    def health(self, service: str = "", timeout_s: Any = _UNSET) -> str:
        """'SERVING' or 'NOT_SERVING' (raises grpc.RpcError when the server does not answer)."""
        response = self._call(self._health.Check, health_pb2.HealthCheckRequest(service=service), timeout_s)
        return _health_name(response.status)

    def stats(self, timeout_s: Any = _UNSET) -> specdec_pb2.GetStatsResponse:
        """The live speculation picture (γ, on/off, α, c, QPS) of the replica that answers."""
        return self._call(self._stub.GetStats, specdec_pb2.GetStatsRequest(), timeout_s)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> "SpecdecClient":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class AsyncSpecdecClient(_Retrying):
    """asyncio client (grpc.aio) with the same methods as coroutines / an async iterator.

    The channel opens at the first call (or `connect`): a list of addresses with host names
    is resolved then in a worker thread, never on the event loop. A list that can never be
    dialled (a malformed entry, mixed IP families) is refused here at once, one whose name does
    not resolve by the first call, before anything is sent (ValueError naming the entry)."""

    def __init__(self, target: str, timeout_s: float | None = 60.0, retries: int = 3, backoff_s: float = 0.2,
                 token: str | None = None, tls_ca_file: str | None = None) -> None:
        super().__init__(timeout_s, retries, backoff_s, token)
        check_target(target)
        self.target = target
        self._credentials = credentials(tls_ca_file)
        self._channel: Any = None
        self._opening: asyncio.Lock | None = None

    async def connect(self) -> None:
        """Resolve the target (off the event loop) and open the channel now, instead of at the
        first call; ValueError naming an entry whose name does not resolve."""
        if self._channel is not None:
            return
        self._opening = self._opening or asyncio.Lock()
        async with self._opening:
            if self._channel is None:
                dialled = await asyncio.get_running_loop().run_in_executor(None, channel_target, self.target)
                self._channel = _dial(dialled, self._credentials, aio=True)
                self._stub = specdec_pb2_grpc.SpeculativeDecodingStub(self._channel)
                self._health = health_pb2_grpc.HealthStub(self._channel)

    async def _call(self, method_of: Callable[[], Any], request: Any, timeout_s: Any) -> Any:
        """method_of: the stub's method, named once the channel is open."""
        await self.connect()
        method = method_of()
        for attempt in range(self.retries + 1):
            try:
                return await method(request, timeout=self._timeout(timeout_s), metadata=self.metadata)
            except grpc.RpcError as exc:
                if attempt == self.retries or not is_retryable(exc):
                    _raise(exc)
                await asyncio.sleep(self._delay(attempt))

    async def generate(
        self, prompt: str | None = None, *, timeout_s: Any = _UNSET, **fields: Any
    ) -> specdec_pb2.GenerateResponse:
        return await self._call(lambda: self._stub.Generate, build_request(prompt, **fields), timeout_s)

    async def generate_stream(
        self, prompt: str | None = None, *, timeout_s: Any = _UNSET, **fields: Any
    ) -> AsyncIterator[specdec_pb2.GenerateChunk]:
        request = build_request(prompt, **fields)
        await self.connect()
        for attempt in range(self.retries + 1):
            call = self._stub.GenerateStream(request, timeout=self._timeout(timeout_s), metadata=self.metadata)
            yielded = False
            try:
                async for chunk in call:
                    yielded = True
                    yield chunk
                return
            except grpc.RpcError as exc:
                if yielded or attempt == self.retries or not is_retryable(exc):
                    _raise(exc)
            finally:
                call.cancel()
            await asyncio.sleep(self._delay(attempt))

    async def health(self, service: str = "", timeout_s: Any = _UNSET) -> str:
        request = health_pb2.HealthCheckRequest(service=service)
        response = await self._call(lambda: self._health.Check, request, timeout_s)
        return _health_name(response.status)

    async def stats(self, timeout_s: Any = _UNSET) -> specdec_pb2.GetStatsResponse:
        """The live speculation picture (γ, on/off, α, c, QPS) of the replica that answers."""
        return await self._call(lambda: self._stub.GetStats, specdec_pb2.GetStatsRequest(), timeout_s)

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()

    async def __aenter__(self) -> "AsyncSpecdecClient":
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()
