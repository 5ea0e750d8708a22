"""The protocol-free frontend on in-process models: what both public APIs do with a request.

Unary and streamed output agree and equal the target alone; usage counts the prompt's and
the output's tokens; a deadline aborts the request and frees its slots; the admission
limit, an unready server and bad input are the core's own exceptions; the typed status
and the health problems say what the engine does.
"""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from specdec.config.config import load_config
from specdec.requests.request import DEFAULT_CAPS
from specdec.wiring.engine_builder import build_served_engine
from specdec.serving.frontend import Frontend
from specdec.sampling.sampling_params import SamplingParams
from specdec.serving.server_status import ServerStatus
from specdec.serving.serving_errors import AdmissionError, DeadlineExceededError, InvalidRequestError, NotReadyError
from specdec.serving.text_request import TextRequest
from specdec.serving.tool_spec import Tool, ToolUse

NUM_SLOTS = 4
MAX_CONCURRENT = 2


@pytest.fixture(scope="module")
def frontend():
    served = build_served_engine(load_config(overrides={
        "cache": {"num_slots": NUM_SLOTS, "max_seq_len": 256},
        "serving": {"max_concurrent_requests": MAX_CONCURRENT},
    }))
    yield Frontend(served)
    served.close()


def all_slots_free(frontend: Frontend, timeout_s: float = 5.0) -> bool:
    async def wait() -> bool:
        for _ in range(int(timeout_s / 0.05)):
            served = frontend.served.loop
            if served.num_requests == 0 and served.engine.verifier.num_free_slots == NUM_SLOTS:
                return True
            await asyncio.sleep(0.05)
        return False

    return asyncio.run(wait())


async def collect(frontend: Frontend, request: TextRequest):
    return [delta async for delta in frontend.stream(request)]


def test_greedy_output_equals_the_target_alone_and_usage_counts_tokens(frontend, prompt_ids, hf_greedy):
    request = TextRequest(prompt_token_ids=tuple(prompt_ids[0]), max_new_tokens=16, request_id="cmpl-test-1")
    completion = asyncio.run(frontend.generate(request))
    assert completion.token_ids == hf_greedy(prompt_ids[0], 16)
    assert completion.request_id == "cmpl-test-1"  # the engine's sequence id: logs and responses agree
    assert completion.finish_reason == "length"
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (len(prompt_ids[0]), 16)
    assert completion.usage.total_tokens == len(prompt_ids[0]) + 16


def test_stream_deltas_add_up_to_the_unary_completion(frontend):
    request = TextRequest(prompt="def fibonacci(n):", max_new_tokens=24, mode="on")
    deltas = asyncio.run(collect(frontend, request))
    completion = asyncio.run(frontend.generate(request))
    assert len(deltas) > 2 and all(d.finish_reason is None for d in deltas[:-1])
    assert "".join(d.text for d in deltas) == completion.text
    assert [t for d in deltas for t in d.token_ids] == completion.token_ids
    last = deltas[-1]
    assert (last.finish_reason, last.usage, last.stats.rounds) == ("length", completion.usage, completion.stats.rounds)


def test_a_stop_string_cuts_the_text_and_finishes_with_stop(frontend):
    full = asyncio.run(frontend.generate(TextRequest(prompt="def parse(line):", max_new_tokens=24)))
    stop = full.text[5:8]
    cut = asyncio.run(frontend.generate(TextRequest(prompt="def parse(line):", max_new_tokens=24, stop=(stop,))))
    assert cut.finish_reason == "stop" and cut.text == full.text[: full.text.index(stop)]


def test_seeded_sampling_is_reproducible(frontend):
    def run(seed: int) -> list[int]:
        sampling = SamplingParams(temperature=0.9, top_p=0.95, seed=seed)
        request = TextRequest(prompt="class Stack:", max_new_tokens=16, sampling=sampling)
        return asyncio.run(frontend.generate(request)).token_ids

    assert run(7) == run(7) != run(8)


def test_a_deadline_aborts_the_request_and_frees_its_slots(frontend):
    request = TextRequest(prompt="def parse(line):", max_new_tokens=200, timeout_s=0.05)
    with pytest.raises(DeadlineExceededError, match="deadline"):
        asyncio.run(frontend.generate(request))
    with pytest.raises(DeadlineExceededError):
        asyncio.run(collect(frontend, request))
    assert all_slots_free(frontend)


def test_the_admission_limit_refuses_the_next_request_and_closing_a_stream_frees_it(frontend):
    async def main():
        streams = [frontend.stream(TextRequest(prompt="def parse(line):", max_new_tokens=200))
                   for _ in range(MAX_CONCURRENT)]
        for stream in streams:
            await stream.__anext__()  # admitted and generating
        with pytest.raises(AdmissionError, match="max_concurrent_requests"):
            await frontend.generate(TextRequest(prompt="x", max_new_tokens=2))
        for stream in streams:
            await stream.aclose()

    asyncio.run(main())
    assert all_slots_free(frontend)


@pytest.mark.parametrize("request_, param", [
    (TextRequest(), "prompt"),
    (TextRequest(prompt="x", prompt_token_ids=(1,)), "prompt"),
    (TextRequest(prompt="x", max_new_tokens=0), "max_new_tokens"),
    (TextRequest(prompt="x", mode="sometimes"), "speculation.mode"),
    (TextRequest(prompt="x", gamma=-1), "speculation.gamma"),
    (TextRequest(prompt="x", proposer="none"), "speculation.proposer"),
    (TextRequest(prompt="x", timeout_s=0), "timeout_s"),
])
def test_bad_input_names_the_field(frontend, request_, param):
    with pytest.raises(InvalidRequestError) as error:
        asyncio.run(frontend.generate(request_))
    assert error.value.param == param and str(error.value).startswith(param)


def test_limits_that_need_the_model_are_checked_on_admission(frontend):
    with pytest.raises(ValueError, match="max_new_tokens"):
        asyncio.run(frontend.generate(TextRequest(prompt="x", max_new_tokens=10**6)))


def test_chat_messages_go_through_the_tokenizers_template(frontend, tokenizer):
    messages = ({"role": "user", "content": "add two numbers"},)
    chat = asyncio.run(frontend.generate(TextRequest(messages=messages, max_new_tokens=8)))
    prompt = tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)
    plain = asyncio.run(frontend.generate(TextRequest(prompt=prompt, max_new_tokens=8)))
    assert prompt.endswith("# assistant:\n") and chat.token_ids == plain.token_ids
    assert chat.usage.prompt_tokens == len(tokenizer(prompt, add_special_tokens=False)["input_ids"])


def test_the_one_call_stop_string_is_the_servers_not_counted_against_the_clients_limit(frontend):
    # parallel_tool_calls false ends an output at its first call's end with a stop string of
    # the server's own: a client may still send as many stop strings as the server allows
    limit = DEFAULT_CAPS.max_stop_strings
    stops = tuple(f"@stop{i}@" for i in range(limit))
    messages = ({"role": "user", "content": "add two numbers"},)
    one_call = ToolUse((Tool.of("add", "", None, "tools[0]"),), "auto", parallel=False)
    answer = asyncio.run(frontend.generate(TextRequest(messages=messages, tools=one_call, stop=stops,
                                                       max_new_tokens=8)))
    many = dataclasses.replace(one_call, parallel=True)
    assert answer.text == asyncio.run(frontend.generate(TextRequest(messages=messages, tools=many,
                                                                    max_new_tokens=8))).text
    with pytest.raises(ValueError, match=f"stop: {limit + 1} stop strings exceed the limit {limit}"):
        asyncio.run(frontend.generate(TextRequest(messages=messages, tools=one_call, stop=stops + ("@more@",),
                                                  max_new_tokens=8)))


def test_an_unloaded_frontend_is_not_ready_and_says_why():
    loading = Frontend()
    assert not loading.is_ready and loading.problems() == ["models are still loading"]
    with pytest.raises(NotReadyError, match="still loading"):
        asyncio.run(loading.generate(TextRequest(prompt="x")))
    loading.load_error = RuntimeError("no GPU")
    assert loading.problems() == ["failed to load: no GPU"]
    with pytest.raises(NotReadyError, match="no GPU"):
        loading.status()


def test_the_status_is_typed_and_counts_this_replicas_rounds(frontend):
    asyncio.run(frontend.generate(TextRequest(prompt="def parse(line):", max_new_tokens=8, mode="on")))
    status = frontend.status()
    assert isinstance(status, ServerStatus) and status.ready and status.problems == ()
    assert status.rounds > 0 and status.drafted > 0
    assert status.acceptance_rate == pytest.approx(status.accepted / status.drafted)
    assert status.policy.gamma == 4 and status.policy.reason.startswith("static")
    assert status.to_dict()["ready"] is True


def test_every_request_that_ends_is_recorded_for_the_metrics_however_it_ends(frontend, prompt_ids):
    frontend.requests.drain()
    prompt = tuple(prompt_ids[1])

    async def main():
        await frontend.generate(TextRequest(prompt_token_ids=prompt, max_new_tokens=5))
        await collect(frontend, TextRequest(prompt_token_ids=prompt, max_new_tokens=6))
        stream = frontend.stream(TextRequest(prompt_token_ids=prompt, max_new_tokens=200))
        await stream.__anext__()
        await stream.aclose()  # the client went away
        with pytest.raises(DeadlineExceededError):
            await frontend.generate(TextRequest(prompt_token_ids=prompt, max_new_tokens=200, timeout_s=0.05))
        with pytest.raises(InvalidRequestError):
            await frontend.generate(TextRequest(prompt="x", max_new_tokens=0))

    asyncio.run(main())
    records = frontend.requests.drain()
    assert [(r.finish_reason, r.streaming) for r in records] == [
        ("length", False), ("length", True), ("cancelled", True), ("deadline", False), ("error", False)]
    unary, streamed = records[0], records[1]
    assert (unary.prompt_tokens, unary.generation_tokens) == (len(prompt), 5)
    assert (streamed.prompt_tokens, streamed.generation_tokens) == (len(prompt), 6)
    assert records[2].generation_tokens >= 1 and records[4].prompt_tokens == 0
    assert all(r.latency_s > 0 and r.queue_s >= 0 for r in records)
