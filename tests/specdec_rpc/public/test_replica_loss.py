"""Inside Serve's gRPC proxy, a dead replica's INTERNAL becomes UNAVAILABLE for every client:
the servicer function wraps each handler Serve's server makes afterwards, unary and streaming,
and leaves every other status as it was."""

import asyncio

import grpc

from specdec_rpc.public.replica_loss import report_replica_loss_as_unavailable

DIED = "The actor died unexpectedly before finishing this task.\n\tclass_name: ServeReplica:specdec:SpecdecRouter"


class Context:
    """The part of grpc.aio's servicer context Serve's handlers use."""

    def __init__(self):
        self._code, self._details = None, None

    def code(self):
        return self._code

    def details(self):
        return self._details

    def set_code(self, code):
        self._code = code

    def set_details(self, details):
        self._details = details


class ServeServer:
    """Like Serve's gRPCGenericServer: handlers come from `service_handler_factory`; each
    answers b"1", b"2" and ends with the status Serve read from the replica."""

    def __init__(self, code, details):
        def factory(service_method, streaming_type):
            if streaming_type == "unary":
                async def unary(request, context):
                    context.set_code(code)
                    context.set_details(details)
                    return b"1"
                return unary

            async def stream(request, context):
                yield b"1"
                yield b"2"
                context.set_code(code)
                context.set_details(details)
            return stream

        self.service_handler_factory = factory


def call(code, details, streaming_type):
    server = ServeServer(code, details)
    report_replica_loss_as_unavailable(None, server)
    handler = server.service_handler_factory(service_method="/s/M", streaming_type=streaming_type)
    context = Context()

    async def run():
        if streaming_type == "unary":
            return [await handler(b"", context)]
        return [message async for message in handler(b"", context)]

    return asyncio.run(run()), context


def test_a_dead_replica_is_unavailable_on_unary_and_streaming_calls():
    for streaming_type, messages in (("unary", [b"1"]), ("stream", [b"1", b"2"])):
        sent, context = call(grpc.StatusCode.INTERNAL, DIED, streaming_type)
        assert sent == messages  # what came before the failure still goes out
        assert context.code() == grpc.StatusCode.UNAVAILABLE
        assert context.details().startswith("the router replica serving this call died")
        assert "The actor died unexpectedly" in context.details()


def test_every_other_status_is_left_as_it_was():
    for code, details in ((grpc.StatusCode.INTERNAL, "a model worker failed"), (None, None),
                          (grpc.StatusCode.INVALID_ARGUMENT, DIED)):
        for streaming_type in ("unary", "stream"):
            _, context = call(code, details, streaming_type)
            assert (context.code(), context.details()) == (code, details)
