"""Request bytes reach the servicer undecoded, so a corrupt message is the caller's mistake
(INVALID_ARGUMENT naming the message type), not an UNKNOWN failure inside a proxy."""

import asyncio
import sys
from pathlib import Path

import grpc
import pytest

from grpc_health.v1 import health_pb2

from specdec_rpc.public.raw_requests import (MalformedRequestError, add_HealthServicer_to_server,
                                      add_SpeculativeDecodingServicer_to_server, parse)
from specdec_rpc.v1 import specdec_pb2

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "scripts"))
from fuzz import varint  # noqa: E402  (the fuzz campaign's wire encoder)

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


def _speculation(field: int, value: int) -> bytes:
    inner = bytes([field << 3]) + varint(value)
    return b"\x0a\x01x" + bytes([5 << 3 | 2]) + varint(len(inner)) + inner  # prompt "x" + speculation


@pytest.mark.parametrize("raw, param", [
    (_speculation(1, 2**32 + 1), "speculation.mode"),  # would read as 1 (ON)
    (_speculation(3, 2**32 + 2), "speculation.proposer"),  # would read as 2 (NGRAM)
    (_speculation(2, 2**32 + 4), "speculation.gamma"),
    (_speculation(1, 2**31), "speculation.mode"),
    (b"\x12\x06" + varint(5) + varint(2**32 + 5), "prompt_token_ids"),  # packed: the second id would read as 5
    (bytes([7 << 3]) + varint(2**32), "stop_token_ids"),  # unpacked uint32
], ids=["mode", "proposer", "gamma", "mode-2^31", "packed-ids", "uint32"])
def test_a_varint_beyond_its_fields_32_bits_is_refused_naming_the_field(raw, param):
    """protobuf would truncate it to a valid value (an unknown enum number turning into a known one)."""
    with pytest.raises(MalformedRequestError, match=rf"^{param}: \d+ does not fit"):
        parse(raw, specdec_pb2.GenerateRequest)


@pytest.mark.parametrize("raw, param", [
    (b"\x0a\x01x\x22\x09" + bytes([1 << 3 | 1]) + bytes(8), "sampling.temperature"),  # a double, not a float
    (b"\x18" + bytes([1]) + bytes([1 << 3 | 0]) + varint(5), "prompt"),  # a string sent as a number
], ids=["double-temperature", "numeric-prompt"])
def test_a_known_field_with_another_wire_type_is_refused_not_dropped(raw, param):
    with pytest.raises(MalformedRequestError, match=rf"^{param}: sent as wire type"):
        parse(raw, specdec_pb2.GenerateRequest)


def test_every_value_a_32_bit_field_can_hold_passes():
    message = specdec_pb2.GenerateRequest(
        prompt_token_ids=[-(2**31), 2**31 - 1, -1], stop_token_ids=[2**32 - 1], max_new_tokens=-5,
        speculation=specdec_pb2.SpeculationParams(mode=2**31 - 1, gamma=-(2**31), proposer=-1),
        sampling=specdec_pb2.SamplingParams(temperature=0.5, top_k=-3, top_p=0.25, seed=2**64 - 1))
    assert parse(message.SerializeToString(), specdec_pb2.GenerateRequest) == message


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

    async def Check(self, raw, context):  # noqa: N802
        try:
            request = parse(raw, health_pb2.HealthCheckRequest)
        except MalformedRequestError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        status = (health_pb2.HealthCheckResponse.SERVING if not request.service
                  else health_pb2.HealthCheckResponse.UNKNOWN)
        return health_pb2.HealthCheckResponse(status=status)


def test_a_real_grpc_server_hands_the_bytes_to_the_servicer():
    async def scenario():
        server = grpc.aio.server()
        add_SpeculativeDecodingServicer_to_server(EchoServicer(), server)
        add_HealthServicer_to_server(EchoServicer(), server)
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
                health = channel.unary_unary("/grpc.health.v1.Health/Check")  # the health service takes bytes too
                assert health_pb2.HealthCheckResponse.FromString(await health(b"")).status == 1
                with pytest.raises(grpc.aio.AioRpcError) as error:
                    await health(b"\x0a\x05ab")  # a truncated service name
                assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        finally:
            await server.stop(None)

    asyncio.run(scenario())
