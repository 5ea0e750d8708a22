"""One client request that asks for several sequences (OpenAI's `n`, a list of prompts) as
several engine requests, run together and answered as one.

Choice i of a request with n samples per prompt is sample i % n of prompt i // n (OpenAI's
indexes). Each choice is its own engine request, submitted at once, so they share the
rounds; the samples of one prompt share its prefill: the target forks the first one's
cache slot for the others when they join in the same round, and attaches its full blocks
from the prefix cache when they join later (`TargetVerifier._sync`). With a seed, sample j
draws under `choice_seed(seed, j)`: sample 0 under the seed itself (so n = 1 is unchanged),
the others under seeds derived from it, so the whole response is reproducible. Only sample 0
of a prompt asks for its prompt logprobs: the others' are the same.

All or nothing: a request whose choices cannot all be admitted, or one of whose choices
fails, fails whole (the others are cancelled, which frees their slots).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
from collections.abc import AsyncIterator

from specdec.serving.frontend import Completion, Delta, Frontend
from specdec.serving.text_request import TextRequest

MAX_CHOICES = 128  # the most choices (prompts × n) one request may ask for (OpenAI's n limit)


def choice_seed(seed: int | None, sample: int) -> int | None:
    """The seed of sample `sample` of a prompt: the request's own for sample 0, a uint64
    derived from (seed, sample) otherwise; None stays None (each choice draws its own)."""
    if seed is None or sample == 0:
        return seed
    digest = hashlib.blake2b(f"{seed}:{sample}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def choice_requests(prompts: list[TextRequest], n: int) -> list[TextRequest]:
    """Each prompt's request n times, in choice order, with derived seeds; prompt logprobs
    only on each prompt's sample 0 (on every sample of a request that only scores)."""
    return [dataclasses.replace(
        base, sampling=dataclasses.replace(base.sampling, seed=choice_seed(base.sampling.seed, j)),
        prompt_logprobs=base.prompt_logprobs if j == 0 or base.scores_only else None,
    ) for base in prompts for j in range(n)]


async def generate_all(frontend: Frontend, requests: list[TextRequest]) -> list[Completion]:
    """Every choice's completion, in order; the first failure cancels the others and is raised."""
    tasks = [asyncio.ensure_future(frontend.generate(r)) for r in requests]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def stream_all(frontend: Frontend, requests: list[TextRequest]) -> AsyncIterator[tuple[int, Delta]]:
    """(choice index, Delta) as the choices' rounds come out. Nothing is yielded before every
    choice has its first Delta, so a choice that fails at once (bad input, the admission
    limit) fails the request before its response starts. Closing it aborts every choice."""
    streams = [frontend.stream(r) for r in requests]
    try:
        firsts = await _firsts(streams)
        for index, delta in enumerate(firsts):
            yield index, delta
        pending = {asyncio.ensure_future(s.__anext__()): i for i, s in enumerate(streams) if not _last(firsts[i])}
        try:
            while pending:
                done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in sorted(done, key=pending.get):
                    index, delta = pending.pop(task), task.result()
                    yield index, delta
                    if not _last(delta):
                        pending[asyncio.ensure_future(streams[index].__anext__())] = index
        finally:
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
    finally:
        for stream in streams:
            with contextlib.suppress(Exception):
                await stream.aclose()


async def _firsts(streams: list[AsyncIterator[Delta]]) -> list[Delta]:
    """Each stream's first Delta; when one fails, the others' waits are cancelled."""
    tasks = [asyncio.ensure_future(s.__anext__()) for s in streams]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


def _last(delta: Delta) -> bool:
    """A stream's last Delta carries its finish reason (every Delta carries the usage so far)."""
    return delta.finish_reason is not None
