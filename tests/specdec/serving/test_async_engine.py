"""AsyncEngine: a loop thread runs rounds while asyncio callers stream their tokens.

Requests join at the next round and share it (continuous batching); cancelling a consumer
aborts its request and frees its slots on the target and the draft; the admission limit
raises AdmissionError; a failing round fails its requests but not the loop.
"""

import asyncio
import threading

import pytest

from specdec.serving.async_engine import AdmissionError, AsyncEngine, EngineClosedError
from specdec.requests.request import GenerationRequest
from specdec.sampling.sampling_params import SamplingParams
from specdec.verifiers.verifier import Verifier


class RecordingVerifier(Verifier):
    """Wraps a verifier: records batch sizes and can fail the next `fail_next` rounds."""

    def __init__(self, inner: Verifier) -> None:
        self.inner = inner
        self.vocab_size = inner.vocab_size
        self.max_seq_len = inner.max_seq_len
        self.batch_sizes: list[int] = []
        self.fail_next = 0
        self.poison: tuple[int, ...] | None = None  # a prompt whose rows fail every round

    @property
    def num_free_slots(self) -> int:
        return self.inner.num_free_slots

    def verify(self, requests):
        if self.fail_next:
            self.fail_next -= 1
            raise ConnectionError("target worker unreachable")
        if any(tuple(r.token_ids[: len(self.poison or ())]) == self.poison for r in requests):
            raise RuntimeError("this row breaks the target")
        self.batch_sizes.append(len(requests))
        return self.inner.verify(requests)

    def release(self, seq_id):
        self.inner.release(seq_id)


@pytest.fixture(scope="module")
def built(make_engine):
    built = make_engine("draft", gamma=4, num_slots=4)
    built.engine.verifier = RecordingVerifier(built.engine.verifier)
    return built


@pytest.fixture
def loop_engine(built):
    async_engine = AsyncEngine(built.engine, max_concurrent_requests=3)
    yield async_engine
    async_engine.shutdown()


def free_slots(built) -> tuple[int, int]:
    return built.engine.verifier.num_free_slots, built.engine.proposer.proposers["draft"].runner.num_free_slots


async def stream_all(async_engine, request):
    stream = async_engine.submit(request)
    chunks = [out.new_token_ids async for out in stream]
    return chunks, await stream.result()


def test_a_stream_yields_each_rounds_tokens_and_ends_with_the_result(loop_engine, prompt_ids, hf_greedy):
    chunks, result = asyncio.run(stream_all(loop_engine, GenerationRequest(prompt_ids[0], 20)))
    assert len(chunks) > 1, "tokens arrive round by round"
    assert [t for c in chunks for t in c] == result.token_ids == hf_greedy(prompt_ids[0], 20)
    assert result.finish_reason == "length" and result.stats.rounds == len(chunks)


def test_concurrent_requests_share_rounds_and_equal_their_single_runs(built, loop_engine, prompt_ids, hf_greedy):
    async def main():
        requests = [GenerationRequest(prompt_ids[i], 12 + 4 * i) for i in range(3)]
        return await asyncio.gather(*(loop_engine.generate(r) for r in requests))

    built.engine.verifier.batch_sizes.clear()
    results = asyncio.run(main())
    for i, result in enumerate(results):
        assert result.token_ids == hf_greedy(prompt_ids[i], 12 + 4 * i)
    assert max(built.engine.verifier.batch_sizes) == 3


def test_a_rounds_outputs_wake_the_callers_loop_once(built, loop_engine, prompt_ids):
    async def drain(stream):
        return [out async for out in stream]

    async def main():
        loop, wake_ups = asyncio.get_running_loop(), []
        schedule = loop.call_soon_threadsafe
        loop.call_soon_threadsafe = lambda *args: wake_ups.append(1) or schedule(*args)
        streams = [loop_engine.submit(GenerationRequest(prompt_ids[i], 12)) for i in range(3)]
        chunks = await asyncio.gather(*(drain(stream) for stream in streams))
        return chunks, len(wake_ups)

    verified = len(built.engine.verifier.batch_sizes)
    chunks, wake_ups = asyncio.run(main())
    rounds = len(built.engine.verifier.batch_sizes) - verified
    items = sum(len(c) + 1 for c in chunks)  # each round's output and each result
    assert wake_ups <= rounds < items, "one wake-up per round, not one per stream"


def test_a_request_joins_a_running_batch_at_the_next_round(built, loop_engine, prompt_ids, hf_greedy):
    async def main():
        first = loop_engine.submit(GenerationRequest(prompt_ids[0], 24))
        await first.__anext__()  # the first request is running
        second = await loop_engine.generate(GenerationRequest(prompt_ids[1], 8))
        return await first.result(), second

    built.engine.verifier.batch_sizes.clear()
    first, second = asyncio.run(main())
    assert first.token_ids == hf_greedy(prompt_ids[0], 24) and second.token_ids == hf_greedy(prompt_ids[1], 8)
    assert built.engine.verifier.batch_sizes[0] == 1 and 2 in built.engine.verifier.batch_sizes


async def wait_for(condition, timeout_s: float = 10.0) -> None:
    for _ in range(int(timeout_s / 0.02)):
        if condition():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("condition not reached")


def test_cancelling_the_consumer_aborts_the_request_and_frees_both_slots(built, loop_engine, prompt_ids):
    full = free_slots(built)

    async def main():
        stream = loop_engine.submit(GenerationRequest(prompt_ids[0], 200, ignore_eos=True))
        consumer = asyncio.create_task(stream.result())
        await wait_for(lambda: free_slots(built) != full)
        consumer.cancel()
        with pytest.raises(asyncio.CancelledError):
            await consumer
        await wait_for(lambda: free_slots(built) == full and loop_engine.num_requests == 0)

    asyncio.run(main())


def test_closing_a_stream_early_aborts_the_request(built, loop_engine, prompt_ids):
    full = free_slots(built)

    async def main():
        async with loop_engine.submit(GenerationRequest(prompt_ids[1], 200, ignore_eos=True)) as stream:
            await stream.__anext__()
        await wait_for(lambda: free_slots(built) == full and loop_engine.num_requests == 0)

    asyncio.run(main())


def test_a_caller_gone_when_its_request_finishes_is_forgotten_and_the_loop_goes_on(
        built, loop_engine, prompt_ids, hf_greedy):
    """Its event loop closed before the last output (a client that hung up as the request
    ended): the output cannot be handed over, the request is dropped, the loop serves on."""
    full = free_slots(built)

    async def leave():
        loop_engine.submit(GenerationRequest(prompt_ids[0], 1, ignore_eos=True))  # one round: output and end

    asyncio.run(leave())  # the caller's loop is closed before the round runs

    async def wait_then_next():
        await wait_for(lambda: loop_engine.num_requests == 0 and free_slots(built) == full)
        return await stream_all(loop_engine, GenerationRequest(prompt_ids[1], 8, ignore_eos=True))

    _, result = asyncio.run(wait_then_next())
    assert result.token_ids == hf_greedy(prompt_ids[1], 8)


def test_the_admission_limit_rejects_then_admits_again(loop_engine, prompt_ids):
    async def main():
        streams = [loop_engine.submit(GenerationRequest(prompt_ids[i], 6)) for i in range(3)]
        with pytest.raises(AdmissionError, match="max_concurrent_requests=3"):
            loop_engine.submit(GenerationRequest(prompt_ids[3], 6))
        for stream in streams:
            await stream.result()
        return await loop_engine.generate(GenerationRequest(prompt_ids[3], 6))

    assert len(asyncio.run(main()).token_ids) == 6


def test_a_request_the_model_cannot_serve_fails_at_submit_naming_the_field(loop_engine, built):
    async def main():
        too_long = [5] * built.engine.verifier.max_seq_len
        with pytest.raises(ValueError, match="prompt"):
            loop_engine.submit(GenerationRequest(too_long, 4))
        with pytest.raises(ValueError, match="max_new_tokens"):
            loop_engine.submit(GenerationRequest([5], 10**6))

    asyncio.run(main())
    assert loop_engine.num_requests == 0


def test_a_failing_round_fails_its_requests_and_the_loop_goes_on(built, loop_engine, prompt_ids, hf_greedy):
    full = free_slots(built)

    async def main():
        built.engine.verifier.fail_next = 1
        with pytest.raises(ConnectionError, match="unreachable"):
            await loop_engine.generate(GenerationRequest(prompt_ids[0], 8))
        assert free_slots(built) == full and loop_engine.num_requests == 0
        return await loop_engine.generate(GenerationRequest(prompt_ids[0], 8))

    assert asyncio.run(main()).token_ids == hf_greedy(prompt_ids[0], 8)


def test_a_request_that_breaks_the_round_fails_alone_and_its_neighbours_finish(
    built, loop_engine, prompt_ids, hf_greedy
):
    full = free_slots(built)

    async def main():
        built.engine.verifier.poison = tuple(prompt_ids[3])
        try:
            good = [asyncio.ensure_future(stream_all(loop_engine, GenerationRequest(p, 12))) for p in prompt_ids[:2]]
            with pytest.raises(RuntimeError, match="breaks the target"):
                await stream_all(loop_engine, GenerationRequest(prompt_ids[3], 12))
            return [await g for g in good]
        finally:
            built.engine.verifier.poison = None

    results = asyncio.run(main())
    for (chunks, result), prompt in zip(results, prompt_ids[:2]):
        assert [t for c in chunks for t in c] == result.token_ids == hf_greedy(prompt, 12)
    assert free_slots(built) == full and loop_engine.num_requests == 0


def test_streamed_text_adds_up_to_the_final_text(loop_engine, tokenizer, prompt_ids):
    async def main():
        stream = loop_engine.submit(GenerationRequest(prompt_ids[1], 40, stop=("\n\n",)))
        texts = [out.text async for out in stream]
        return texts, await stream.result()

    texts, result = asyncio.run(main())
    assert "".join(texts) == result.text
    assert result.text == tokenizer.decode(result.token_ids, skip_special_tokens=True).split("\n\n")[0]


def test_seeded_sampling_is_reproducible_through_the_loop(loop_engine, prompt_ids):
    request = GenerationRequest(prompt_ids[2], 16, SamplingParams(temperature=0.9, top_k=40, seed=11), ignore_eos=True)
    first = asyncio.run(loop_engine.generate(request))
    assert asyncio.run(loop_engine.generate(request)).token_ids == first.token_ids


def test_shutdown_fails_unfinished_requests_and_frees_their_slots(built, prompt_ids):
    async_engine = AsyncEngine(built.engine)
    full = free_slots(built)

    async def main():
        stream = async_engine.submit(GenerationRequest(prompt_ids[0], 200, ignore_eos=True))
        await stream.__anext__()
        await asyncio.get_running_loop().run_in_executor(None, async_engine.shutdown)
        with pytest.raises(EngineClosedError):
            await stream.result()
        with pytest.raises(EngineClosedError):
            async_engine.submit(GenerationRequest(prompt_ids[0], 4))

    asyncio.run(main())
    assert free_slots(built) == full and not async_engine._thread.is_alive()


def test_on_idle_runs_on_the_loop_thread_once_the_work_is_done(built, prompt_ids):
    calls = []
    async_engine = AsyncEngine(built.engine, on_idle=lambda: calls.append(threading.current_thread().name))
    try:
        asyncio.run(async_engine.generate(GenerationRequest(prompt_ids[0], 4)))
        asyncio.run(wait_for(lambda: bool(calls)))
        assert calls == ["specdec-engine-loop"]
    finally:
        async_engine.shutdown()


def deferred(built, request) -> tuple[list[list[int]], list[str], object]:
    """Stream `request` through a loop that defers its hand-overs; the chunks, the thread that
    handed each batch to the caller's loop, and the result."""
    async def main():
        loop, threads = asyncio.get_running_loop(), []
        schedule = loop.call_soon_threadsafe
        loop.call_soon_threadsafe = lambda *args: threads.append(threading.current_thread().name) or schedule(*args)
        stream = async_engine.submit(request)
        chunks = [out.new_token_ids async for out in stream]
        return chunks, threads, await stream.result()

    async_engine = AsyncEngine(built.engine, max_concurrent_requests=3, defer_handoff=True)
    try:
        return asyncio.run(main())
    finally:
        async_engine.shutdown()


def test_a_deferred_hand_over_runs_once_the_next_rounds_request_is_sent(built, prompt_ids, hf_greedy, monkeypatch):
    from specdec.serving import after_send

    verify = built.engine.verifier.verify

    def sent_then_verify(requests):  # as a round stream: gRPC's sending thread writes the request
        sender = threading.Thread(target=after_send.request_sent, name="sender")
        sender.start()
        sender.join()
        return verify(requests)

    monkeypatch.setattr(built.engine.verifier, "verify", sent_then_verify)
    chunks, threads, result = deferred(built, GenerationRequest(prompt_ids[0], 20))
    assert [t for c in chunks for t in c] == result.token_ids == hf_greedy(prompt_ids[0], 20)
    assert threads[:-1] == ["sender"] * (len(threads) - 1), "each round's items went with the next round's request"
    assert threads[-1] == "specdec-engine-loop", "the last round's, when the loop ran out of work"


def test_a_deferred_hand_over_without_a_sent_request_comes_at_the_next_round_or_when_idle(
    built, prompt_ids, hf_greedy
):
    chunks, threads, result = deferred(built, GenerationRequest(prompt_ids[1], 20))
    assert [t for c in chunks for t in c] == result.token_ids == hf_greedy(prompt_ids[1], 20)
    assert set(threads) == {"specdec-engine-loop"} and len(chunks) > 1
