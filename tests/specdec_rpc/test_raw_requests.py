"""Request bytes reach the servicer undecoded, so a corrupt message is the caller's mistake
(INVALID_ARGUMENT naming the message type), not an UNKNOWN failure inside a proxy."""

import asyncio

import grpc
import pytest

from specdec_rpc.raw_requests import MalformedRequestError, add_SpeculativeDecodingServicer_to_server, parse
from specdec_rpc.v1 import specdec_pb2

INVALID_UTF8_PROMPT = b"\x0a\x02\xff\xfe"  # field 1 (prompt, a string) holding bytes that are not UTF-8
TRUNCATED = specdec_pb2.GenerateRequest(prompt="hello", max_new_tokens=4).SerializeToString()[:-3]


def test_parse_decodes_valid_bytes_and_passes_decoded_messages_through():
    message = specdec_pb2.GenerateRequest(prompt="héllo", max_new_tokens=4)
    assert parse(message.SerializeToString(), specdec_pb2.GenerateRequest) == message
    assert parse(message, specdec_pb2.GenerateRequest) is message
    assert parse(b"", specdec_pb2.GenerateRequest) == specdec_pb2.GenerateRequest()


@pytest.mark.parametrize("raw", [INVALID_UTF8_PROMPT, TRUNCATED, b"\xff" * 64, "text", None],
                         ids=["invalid utf-8", "truncated", "garbage", "str", "none"])
def test_parse_refuses_what_is_not_a_message_naming_the_type(raw):
    with pytest.raises(MalformedRequestError, match=r"^request: .*GenerateRequest"):
        parse(raw, specdec_pb2.GenerateRequest)


class EchoServicer:
    """Answers with the prompt's length, or INVALID_ARGUMENT for bytes that do not parse."""

    async def Generate(self, raw, context):  # noqa: N802
        try:
            request = parse(raw, specdec_pb2.GenerateRequest)
        except MalformedRequestError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        return specdec_pb2.GenerateResponse(text=str(len(request.prompt)))

    async def GenerateStream(self, raw, context):  # noqa: N802
        request = parse(raw, specdec_pb2.GenerateRequest)
        for token in range(request.max_new_tokens):
            yield specdec_pb2.GenerateChunk(token_ids=[token])

    async def GetStats(self, raw, context):  # noqa: N802
        parse(raw, specdec_pb2.GetStatsRequest)
        return specdec_pb2.GetStatsResponse(rounds=7)


def test_a_real_grpc_server_hands_the_bytes_to_the_servicer():
    async def scenario():
        server = grpc.aio.server()
        add_SpeculativeDecodingServicer_to_server(EchoServicer(), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                raw = channel.unary_unary("/specdec.v1.SpeculativeDecoding/Generate")  # bytes in, bytes out
                good = specdec_pb2.GenerateRequest(prompt="four", max_new_tokens=2).SerializeToString()
                assert specdec_pb2.GenerateResponse.FromString(await raw(good)).text == "4"
                codes = []
                for bad in (INVALID_UTF8_PROMPT, TRUNCATED):
                    with pytest.raises(grpc.aio.AioRpcError) as error:
                        await raw(bad)
                    codes.append((error.value.code(), "GenerateRequest" in error.value.details()))
                assert codes == [(grpc.StatusCode.INVALID_ARGUMENT, True)] * 2
                stream = channel.unary_stream("/specdec.v1.SpeculativeDecoding/GenerateStream")
                chunks = [specdec_pb2.GenerateChunk.FromString(c) async for c in stream(good)]
                assert [list(c.token_ids) for c in chunks] == [[0], [1]]
                stats = channel.unary_unary("/specdec.v1.SpeculativeDecoding/GetStats")
                assert specdec_pb2.GetStatsResponse.FromString(await stats(b"")).rounds == 7
        finally:
            await server.stop(None)

    asyncio.run(scenario())
