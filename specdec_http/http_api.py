"""The OpenAI-compatible HTTP routes over the core frontend (Starlette requests and responses).

    POST /v1/completions        text (or token-id) prompt -> completion; stream: true -> SSE
    POST /v1/chat/completions   messages (the tokenizer's chat template) -> chat completion
                                (tools -> tool_calls: specdec_http.tool_calls)
    GET  /v1/models             the served model (its context as max_model_len)
    POST /tokenize, /detokenize the served tokenizer (vLLM's shapes: specdec_http.tokenize_routes)
    GET  /health                200 with the server status when serving, 503 otherwise
    GET  /metrics               with `metrics`: Prometheus text (specdec_http.metrics_route)

`HttpApi.handle` takes one request and returns its response, so any host can run it: Ray
Serve's HTTP proxy calls the SpecdecRouter's `__call__` with it, and `asgi_app` wraps it
for a plain ASGI server. A stream is answered only once its first round is out, so bad
input, the admission limit and an unready server get their HTTP status (400 / 429 with
Retry-After / 503) rather than a broken stream; a failure after that ends the stream with
an error event.
A client that disconnects cancels the request, which frees its cache slots. With
`authorize`, every route but the open ones (/health) needs `authorization: Bearer <token>`:
401 otherwise. With `cors`, listed browser origins may call it (specdec_http.cors).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import replace
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from specdec.serving.fan_out import generate_all, stream_all
from specdec.serving.frontend import Completion, Delta, Frontend, Usage
from specdec.serving.tool_parser import ToolParser
from specdec.serving.serving_errors import RETRY_AFTER_S, ErrorKind, InvalidRequestError, NotFoundError, classify
from specdec_http.cors import Cors
from specdec_http.metrics_route import MetricsRoute
from specdec_http.openai_logprobs import LogprobsFormat
from specdec.serving.text_request import TextRequest
from specdec_http.openai_api import chat_choices, completion_choices, named_as_sent
from specdec_http.openai_responses import (
    DONE, Call, UsageReport, chunk_events, completion_object, dump, error_body, sse, usage_event,
)
from specdec_http.protocol.models import ModelCard, ModelList, ModelSpeculation
from specdec_http.tokenize_routes import detokenize, tokenize
from specdec_http.tool_calls import tool_parser

logger = logging.getLogger(__name__)

ErrorKindOf = Callable[[BaseException], tuple[ErrorKind, str]]
#: (seconds to the first tokens, [(seconds since the previous tokens, tokens)]) of a finished stream
StreamObserver = Callable[[float | None, list[tuple[float, int]]], None]
#: checks an `authorization` header value (None: absent); raises AuthenticationError
Authorize = Callable[[str | None], None]
DISCONNECT_POLL_S = 0.25  # how often a unary request checks whether its client is still there
BODY_TIMEOUT_S = 30.0  # the longest a request's body may take to arrive in full


class ClientDisconnectedError(ConnectionError):
    """The client went away before its unary request finished (the request was cancelled)."""


def core_error_kind(exc: BaseException) -> tuple[ErrorKind, str]:
    """The core's classification (hosts that call gRPC workers pass one that knows their errors)."""
    kind = classify(exc)
    return kind, (f"{type(exc).__name__}: {exc}" if kind is ErrorKind.INTERNAL else str(exc) or kind.value)


class HttpApi:
    """The routes on one frontend. error_kind: how a failure is classified (the router
    passes `specdec_rpc.public.status_codes.error_kind`, which also knows a worker's gRPC errors);
    observe_stream: told each finished stream's latencies (the router's TTFT / ITL metrics);
    metrics: the /metrics route (none: no such route)."""

    def __init__(self, frontend: Frontend, error_kind: ErrorKindOf = core_error_kind,
                 observe_stream: StreamObserver | None = None, authorize: Authorize | None = None,
                 open_paths: frozenset[str] = frozenset({"/health"}), body_timeout_s: float = BODY_TIMEOUT_S,
                 cors: Cors | None = None, metrics: MetricsRoute | None = None) -> None:
        self.frontend = frontend
        self.body_timeout_s = body_timeout_s  # a body not in within it is refused (400)
        self.error_kind = error_kind
        self.observe_stream = observe_stream
        self.authorize = authorize  # raises AuthenticationError (401) unless the header carries a valid token
        self.open_paths = open_paths  # answered without a token
        self.cors = cors or Cors()  # no origins: off
        self.created = int(time.time())  # the models' `created`: when this server started
        self.routes: dict[tuple[str, str], Callable[[Request], Awaitable[Response]]] = {
            ("POST", "/v1/completions"): lambda r: self._generate(r, chat=False),
            ("POST", "/v1/chat/completions"): lambda r: self._generate(r, chat=True),
            ("GET", "/v1/models"): self._models,
            ("POST", "/tokenize"): lambda r: self._tokenizer_route(r, tokenize),
            ("POST", "/detokenize"): lambda r: self._tokenizer_route(r, detokenize),
            ("GET", "/health"): self._health,
        }
        if metrics is not None:  # Prometheus text of the replica's metrics
            self.routes[("GET", "/metrics")] = metrics

    async def handle(self, request: Request) -> Response:
        """The response to one request; failures become OpenAI error objects."""
        return self.cors.decorate(request, await self._handle(request))

    async def _handle(self, request: Request) -> Response:
        path = _route_path(request)
        route = self.routes.get((request.method, path))
        preflight = self.cors.preflight(request, sorted(m for m, p in self.routes if p == path))
        if preflight is not None:  # before authentication: a browser's preflight carries no token
            return preflight
        try:
            if self.authorize is not None and path not in self.open_paths:
                self.authorize(request.headers.get("authorization"))
            if route is None:
                allowed = sorted(m for m, p in self.routes if p == path)
                if allowed:
                    return _method_not_allowed(request.method, path, allowed)
                raise NotFoundError(f"{request.method} {path}: no such route")
            return await route(request)
        except Exception as exc:
            return self.error_response(exc)

    def error_response(self, exc: BaseException) -> JSONResponse:
        kind, message = self.error_kind(exc)
        if kind is ErrorKind.INTERNAL and not isinstance(exc, ClientDisconnectedError):
            logger.error("an HTTP request failed: %s", message, exc_info=exc)
        status, body = error_body(kind, message, exc)
        headers = {"Retry-After": str(RETRY_AFTER_S)} if kind is ErrorKind.OVERLOADED else None
        return JSONResponse(body, status_code=status, headers=headers)

    async def _generate(self, request: Request, chat: bool) -> Response:
        self.frontend.ready()  # 503 while loading, whatever the body says (the model name is not known yet)
        body = await _json(request, self.body_timeout_s)
        try:
            return await self._answer(request, body, chat)
        except ValueError as exc:  # bad input the core found: named as the client sent it
            raise named_as_sent(exc, body, chat) from None

    async def _answer(self, request: Request, body: Any, chat: bool) -> Response:
        choices = (chat_choices if chat else completion_choices)(body, self.frontend.model)
        call = Call.new(chat, self.frontend.model)
        if body.get("user"):  # the end user's id: logged with the request's id, not used otherwise
            logger.info("request %s is from user %r", call.id, body["user"])
        # the response's id is the engine's (choice i of several: id-i)
        several = len(choices.requests) > 1
        requests = [replace(r, request_id=f"{call.id}-{i}" if several else call.id)
                    for i, r in enumerate(choices.requests)]
        formats = [None if r.logprobs is None else LogprobsFormat(self._token_text) for r in requests]
        parsers = [tool_parser(r, lambda: self.frontend.ready().tokenizer) for r in requests]  # chat with tools
        echo = [self._echo_text(r) for r in requests] if choices.echo else None
        if not choices.stream:
            completions = await _unless_disconnected(request, generate_all(self.frontend, requests))
            return JSONResponse(completion_object(call, _shared_prompt_logprobs(completions, choices.n), formats,
                                                  echo, choices.n, parsers))
        started = time.perf_counter()
        deltas = stream_all(self.frontend, requests)
        try:
            first = await deltas.__anext__()  # errors before the first round get their status
        except BaseException:
            await deltas.aclose()
            raise
        report = UsageReport.of(body.get("stream_options"))
        events = self._events(call, first, deltas, _Streamed(choices.n, formats, echo, report, parsers), started)
        return StreamingResponse(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    async def _events(self, call: Call, first: tuple[int, Delta], deltas: AsyncIterator[tuple[int, Delta]],
                      streamed: "_Streamed", started: float):
        """SSE: one event per choice and round, `data: [DONE]` at the end; an error event if
        it fails. Closing (the client went away) closes `deltas`, which aborts the request."""
        timing = _StreamTiming(started, first[1])
        try:
            for event in streamed.events(call, *first):
                yield event
            async for index, delta in deltas:
                timing.add(delta)
                for event in streamed.events(call, index, delta):
                    yield event
            for event in streamed.usage(call):
                yield event
            yield DONE
            if self.observe_stream is not None:
                self.observe_stream(timing.first_s, timing.gaps)
        except Exception as exc:
            kind, message = self.error_kind(exc)
            yield sse(error_body(kind, message, exc)[1])
        finally:
            await deltas.aclose()

    def _echo_text(self, request: TextRequest) -> str:
        """The prompt text a choice echoes (token ids decoded)."""
        return request.prompt or self.frontend.ready().decode(list(request.prompt_token_ids))

    def _token_text(self, token_id: int) -> str:
        """One token's text, decoded alone (a logprobs entry's `token`)."""
        return self.frontend.ready().decode([token_id])

    async def _models(self, request: Request) -> Response:
        model = ModelCard(id=self.frontend.model, object="model", created=self.created, owned_by="specdec",
                          max_model_len=self.frontend.max_model_len,
                          speculation=ModelSpeculation(proposers=list(self.frontend.proposers)))
        return JSONResponse(dump(ModelList(object="list", data=[model])))

    async def _tokenizer_route(self, request: Request, answer) -> Response:
        return JSONResponse(await answer(self.frontend, await _json(request)))

    async def _health(self, request: Request) -> Response:
        if not self.frontend.is_ready:
            return JSONResponse({"status": "not serving", "problems": self.frontend.problems()}, status_code=503)
        return JSONResponse({"status": "serving", **self.frontend.status().to_dict()})


class _Streamed:
    """A stream's choices: n per prompt, each with its logprobs format, echoed prompt and tool parser;
    the prompt logprobs of each prompt's first choice (the others' are the same) and the
    usage of every finished choice."""

    def __init__(self, n: int, formats: list[LogprobsFormat | None], echo: list[str] | None,
                 report: UsageReport, parsers: list[ToolParser | None]) -> None:
        self.n, self.formats, self.echo, self.report = n, formats, echo, report
        self.parsers = parsers  # each choice's tool parser (chat with tools), else None
        self.started: set[int] = set()
        self.prompts: dict[int, Delta] = {}  # prompt -> its first choice's first Delta (the prompt logprobs)
        self.usages: dict[int, Usage] = {}  # choice -> its usage, when finished

    def events(self, call: Call, index: int, delta: Delta) -> list[str]:
        first = index not in self.started
        self.started.add(index)
        if first and index % self.n == 0:
            self.prompts[index // self.n] = delta
        elif first and self.echo is not None:  # the prompt logprobs its prompt's first choice carried
            scored = self.prompts[index // self.n]
            delta = replace(delta, prompt_logprobs=scored.prompt_logprobs, prompt_token_ids=scored.prompt_token_ids)
        if delta.usage is not None:
            self.usages[index] = delta.usage
        each = UsageReport(final=False, continuous=self.report.continuous)  # the final usage: `usage`
        return chunk_events(call, delta, first, each, self.formats[index], index,
                            self.echo[index] if self.echo else None, self.parsers[index])

    def usage(self, call: Call) -> list[str]:
        """The usage chunk (with include_usage): prompts counted once, all choices' tokens."""
        if not self.report.final:
            return []
        counts = [self.usages[i] for i in sorted(self.usages)]
        total = Usage(sum(u.prompt_tokens for u in counts[:: self.n]), sum(u.completion_tokens for u in counts),
                      sum(u.cached_tokens for u in counts[:: self.n]))
        return [usage_event(call, total)]


def _shared_prompt_logprobs(completions: list[Completion], n: int) -> list[Completion]:
    """Each choice with its prompt's logprobs (only each prompt's first choice asked for them)."""
    return [c if i % n == 0 or c.prompt_logprobs is not None else
            replace(c, prompt_logprobs=completions[i - i % n].prompt_logprobs,
                    prompt_token_ids=completions[i - i % n].prompt_token_ids)
            for i, c in enumerate(completions)]


class _StreamTiming:
    """When a stream's tokens went out: to the first ones, and between later ones."""

    def __init__(self, started: float, first: Delta) -> None:
        self.last = time.perf_counter()
        self.first_s = self.last - started if first.token_ids else None
        self.gaps: list[tuple[float, int]] = []

    def add(self, delta: Delta) -> None:
        if not delta.token_ids:
            return
        now = time.perf_counter()
        if self.first_s is None:
            self.first_s = now - self.last
        else:
            self.gaps.append((now - self.last, len(delta.token_ids)))
        self.last = now


async def _unless_disconnected(request: Request, work: Coroutine[Any, Any, Any]) -> Any:
    """Await `work`, cancelling it (which aborts the request and frees its slots) when the
    client disconnects first. Ray Serve cancels such a request itself; a plain ASGI server
    does not, so the route watches too."""
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
            if done:
                return task.result()
            if await request.is_disconnected():
                raise ClientDisconnectedError("the client disconnected; its request was cancelled")
    finally:
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


def _method_not_allowed(method: str, path: str, allowed: list[str]) -> JSONResponse:
    """405 in OpenAI's error shape, with the Allow header."""
    error = {"message": f"{method} {path}: method not allowed (use {', '.join(allowed)})",
             "type": "invalid_request_error", "param": None, "code": "method_not_allowed"}
    return JSONResponse({"error": error}, status_code=405, headers={"Allow": ", ".join(allowed)})


def _route_path(request: Request) -> str:
    """The path below the app's route prefix (Serve deployments with route_prefix /specdec
    answer /specdec/v1/...; the prefix arrives as the ASGI root_path)."""
    path, root = request.scope.get("path", "/"), (request.scope.get("root_path") or "").rstrip("/")
    if root and path.startswith(root + "/"):
        path = path[len(root):]
    return path.rstrip("/") or "/"


async def _json(request: Request, timeout_s: float = BODY_TIMEOUT_S) -> Any:
    """The request's JSON body; 400 naming `body` when it is not JSON, nests past what the
    parser can take, or does not arrive in full within `timeout_s` (a Content-Length that
    promises more than the client sends would otherwise hold the request forever)."""
    try:
        raw = await asyncio.wait_for(request.body(), timeout_s)
    except asyncio.TimeoutError:
        raise InvalidRequestError("body", f"not received in full within {timeout_s:g} s") from None
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidRequestError("body", f"is not valid JSON ({exc})") from None
    except RecursionError:
        raise InvalidRequestError("body", "is nested too deeply") from None


def asgi_app(api: HttpApi) -> Any:
    """A Starlette application routing every path to `api.handle` (for a plain ASGI server)."""
    from starlette.applications import Starlette
    from starlette.routing import Route

    async def endpoint(request: Request) -> Response:
        return await api.handle(request)

    return Starlette(routes=[Route("/{path:path}", endpoint, methods=["GET", "POST", "PUT", "DELETE", "OPTIONS"])])
