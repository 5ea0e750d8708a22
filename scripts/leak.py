"""A bounded leak test against a real server: many requests that end every way free every slot.

Sends `--count` requests, `--concurrency` at a time (default: one per slot), to the public
gRPC port: request i completes (i % 3 == 0; its output is checked against the greedy
reference), is cancelled after its first streamed chunk (1), or runs into a deadline of
50-250 ms while queued, prefilling or generating (2). Afterwards every cache slot on the draft worker and on the
target group must be free, released by the router (the workers' `expired_sequences`, slots
freed by a lapsed lease, must not have grown), and `num_slots` concurrent requests must all
succeed with the reference greedy output. The reference is each prompt's greedy output,
recorded one request at a time before the run (the test passes transformers' instead).

Without `--address` it starts `specdec serve`'s stack in-process (local Ray, the worker hub,
the Serve router; `cache.num_slots` = `--num-slots`); with it, it joins the server's Ray
cluster (`--ray-address`) to read the workers' slots through the worker hub of `--config`.
Prints one table row and exits 1 on any failure. `tests/actors/test_router_grpc.py` runs
the same `run()` with fewer requests.

    python scripts/leak.py [--count 1000] [--concurrency NUM_SLOTS] [--num-slots 16]
    python scripts/leak.py --address 127.0.0.1:50051 [--ray-address auto] [--config FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

import grpc  # noqa: E402

from chaos import PROMPTS  # noqa: E402
from specdec_rpc.public.client import AsyncSpecdecClient  # noqa: E402

Prompt = str | Sequence[int]  # a text prompt or token ids

KINDS = ("complete", "cancel", "deadline")
EXPECTED = {"complete": {"OK"}, "cancel": {"CANCELLED"}, "deadline": {"DEADLINE_EXCEEDED", "OK"}}
COMPLETE_TOKENS = 6  # new tokens of a request that completes
REFERENCE_TOKENS = 12  # new tokens of each of the num_slots concurrent requests afterwards
LONG_TOKENS = 100  # the budget of a cancelled or timed-out request (it never gets there)
SETTLE_S = 15.0  # how long the slots may take to be free after the last request


def prompt_fields(prompt: Prompt) -> dict[str, Any]:
    return {"prompt": prompt} if isinstance(prompt, str) else {"prompt_token_ids": list(prompt)}


def kind_of(i: int) -> str:
    return KINDS[i % 3]


async def leak_request(aclient: AsyncSpecdecClient, prompt: Prompt, i: int) -> tuple[str, list[int] | None]:
    """Request i, of kind_of(i): (status name, the token ids of a completed request)."""
    fields = prompt_fields(prompt)
    try:
        kind = kind_of(i)
        if kind == "complete":
            response = await aclient.generate(max_new_tokens=COMPLETE_TOKENS, **fields)
            return "OK", list(response.token_ids)
        if kind == "cancel":
            stream = aclient.generate_stream(max_new_tokens=LONG_TOKENS, **fields)
            await stream.__anext__()
            await stream.aclose()  # cancels the call
            return "CANCELLED", None
        await aclient.generate(max_new_tokens=LONG_TOKENS, timeout_s=0.05 * (1 + i % 5), **fields)
        return "OK", None
    except grpc.RpcError as error:
        return error.code().name, None


async def leak_requests(address: str, prompts: Sequence[Prompt], count: int,
                        concurrency: int) -> list[tuple[str, list[int] | None]]:
    """`count` leak_requests, `concurrency` at a time, request i on prompt i % len(prompts).
    A cancelled request counts against the admission limit until the router's loop drops it
    (next round): RESOURCE_EXHAUSTED is retried after 100 ms, as a client should."""
    gate = asyncio.Semaphore(concurrency)

    async def one(aclient: AsyncSpecdecClient, i: int) -> tuple[str, list[int] | None]:
        async with gate:
            for _ in range(100):
                outcome = await leak_request(aclient, prompts[i % len(prompts)], i)
                if outcome[0] != "RESOURCE_EXHAUSTED":
                    break
                await asyncio.sleep(0.1)
            return outcome

    async with AsyncSpecdecClient(address, timeout_s=120.0, retries=0) as aclient:
        return await asyncio.gather(*(one(aclient, i) for i in range(count)))


async def generate_all(address: str, jobs: Sequence[tuple[Prompt, int]]) -> list[list[int] | str]:
    """All jobs (prompt, max_new_tokens) at once; each one's token ids, or its failure's status name."""
    async def one(aclient: AsyncSpecdecClient, prompt: Prompt, n: int) -> list[int] | str:
        try:
            return list((await aclient.generate(max_new_tokens=n, **prompt_fields(prompt))).token_ids)
        except grpc.RpcError as error:
            return error.code().name

    async with AsyncSpecdecClient(address, timeout_s=120.0, retries=0) as aclient:
        return await asyncio.gather(*(one(aclient, p, n) for p, n in jobs))


def reference_outputs(address: str, prompts: Sequence[Prompt]) -> list[list[int]]:
    """Each prompt's greedy output (REFERENCE_TOKENS), one request at a time."""
    return [asyncio.run(generate_all(address, [(p, REFERENCE_TOKENS)]))[0] for p in prompts]


class HubSlots:
    """The workers' slots as the worker hub sees them (through Ray: no internal secret needed)."""

    def __init__(self, hub: Any) -> None:
        self.hub = hub

    def _infos(self) -> dict[str, dict[str, Any]]:
        import ray

        infos = {"target": ray.get(self.hub.target_info.remote(), timeout=30)}
        draft = ray.get(self.hub.draft_actor.remote(), timeout=30)
        if draft is not None:
            infos["draft"] = ray.get(draft.info.remote(), timeout=30)
        return infos

    def free(self) -> dict[str, int]:
        return {name: int(info["free_slots"]) for name, info in self._infos().items()}

    def expired(self) -> dict[str, int]:
        """Sequences each worker freed because their lease lapsed (not released by a router)."""
        return {name: int(info["expired_sequences"]) for name, info in self._infos().items()}

    def free_within(self, num_slots: int, timeout_s: float) -> dict[str, int]:
        """Free slots once all are free, or as they are after timeout_s."""
        deadline = time.monotonic() + timeout_s
        while True:
            free = self.free()
            if all(n == num_slots for n in free.values()) or time.monotonic() > deadline:
                return free
            time.sleep(0.2)


@dataclass
class LeakReport:
    num_slots: int
    outcomes: dict[str, Counter] = field(default_factory=lambda: {kind: Counter() for kind in KINDS})
    wrong: int = 0  # completed requests whose output was not the reference's prefix
    wall_s: float = 0.0  # the `count` requests
    free_after: dict[str, int] = field(default_factory=dict)
    expired: dict[str, int] = field(default_factory=dict)  # growth of expired_sequences during the run
    concurrent: list[list[int] | str] = field(default_factory=list)
    concurrent_ok: int = 0  # of the num_slots concurrent requests, those with the reference output

    @property
    def sent(self) -> int:
        return sum(sum(c.values()) for c in self.outcomes.values())

    def other(self) -> Counter:
        """Outcomes a request of its kind must not have."""
        return Counter({f"{kind} {code}": n for kind, counter in self.outcomes.items()
                        for code, n in counter.items() if code not in EXPECTED[kind]})

    def failures(self) -> list[str]:
        problems = [f"{n} x {what}" for what, n in self.other().items()]
        if self.outcomes["deadline"]["DEADLINE_EXCEEDED"] == 0:
            problems.append("no request hit its deadline")
        if self.wrong:
            problems.append(f"{self.wrong} completed requests with the wrong output")
        problems += [f"{name}: {n} of {self.num_slots} slots free" for name, n in self.free_after.items()
                     if n != self.num_slots]
        problems += [f"{name}: {n} sequences freed by a lapsed lease, not by the router"
                     for name, n in self.expired.items() if n]
        if self.concurrent_ok != self.num_slots:
            problems.append(f"{self.concurrent_ok} of {self.num_slots} concurrent requests with the reference "
                            f"output (failures: {[r for r in self.concurrent if isinstance(r, str)]})")
        return problems

    def table(self) -> str:
        done = self.outcomes["complete"]["OK"] + self.outcomes["deadline"]["OK"]
        other = ", ".join(f"{what} {n}" for what, n in self.other().items()) or "-"
        free = " / ".join(str(self.free_after.get(name, "-")) for name in ("draft", "target"))
        expired = sum(self.expired.values())
        return "\n".join([
            "| sent | completed | cancelled mid-stream | deadline exceeded | other outcomes | wrong output | "
            "free slots after, draft / target | freed by lease expiry | "
            f"{self.num_slots} concurrent, reference output | wall time |",
            "|---:|---:|---:|---:|---|---:|---|---:|---|---:|",
            f"| {self.sent} | {done} (of which {self.outcomes['deadline']['OK']} before their deadline) | "
            f"{self.outcomes['cancel']['CANCELLED']} | {self.outcomes['deadline']['DEADLINE_EXCEEDED']} | {other} | "
            f"{self.wrong} | {free} of {self.num_slots} | {expired} | "
            f"{self.concurrent_ok} of {self.num_slots} | {self.wall_s:.0f} s |",
        ])


def run(address: str, slots: HubSlots, prompts: Sequence[Prompt], reference: Sequence[Sequence[int]],
        count: int, concurrency: int, num_slots: int) -> LeakReport:
    """The whole check (see the module's docstring); reference[j] is prompts[j]'s greedy
    output of REFERENCE_TOKENS new tokens."""
    report = LeakReport(num_slots)
    expired = slots.expired()
    start = time.monotonic()
    outcomes = asyncio.run(leak_requests(address, prompts, count, concurrency))
    report.wall_s = time.monotonic() - start
    for i, (code, ids) in enumerate(outcomes):
        report.outcomes[kind_of(i)][code] += 1
        if ids is not None:
            ref = list(reference[i % len(prompts)])
            report.wrong += ids != ref[:COMPLETE_TOKENS]
    report.free_after = slots.free_within(num_slots, SETTLE_S)
    jobs = [(prompts[i % len(prompts)], REFERENCE_TOKENS) for i in range(num_slots)]
    report.concurrent = asyncio.run(generate_all(address, jobs))
    report.concurrent_ok = sum(out == list(reference[i % len(prompts)]) for i, out in enumerate(report.concurrent))
    after = slots.expired()
    report.expired = {name: after[name] - expired.get(name, 0) for name in after}
    return report


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--count", type=int, default=1000, help="requests to send (a third of each kind)")
    p.add_argument("--concurrency", type=int, default=None, help="requests in flight at once (default: num_slots)")
    p.add_argument("--num-slots", type=int, default=16, help="cache.num_slots of the server it starts")
    p.add_argument("--address", default=None, help="a running server's public gRPC port (default: start one)")
    p.add_argument("--ray-address", default="auto", help="with --address: the server's Ray cluster")
    p.add_argument("--config", default=None, help="with --address: the server's config (names its worker hub)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import ray

    from actors.worker_hub import HUB_NAMESPACE, find_hub
    from specdec.config.config import load_config

    app = None
    if args.address is None:
        from actors.app import free_port, start_app

        config = load_config(overrides={
            "cache": {"num_slots": args.num_slots, "max_seq_len": 256},
            "serving": {"port": free_port(), "http_port": free_port(), "worker_timeout_s": 10.0, "lease_ttl_s": 2.0},
        })
        app = start_app(config, ray_init_kwargs={"num_cpus": 4, "include_dashboard": False, "log_to_driver": False})
        address, hub = app.address, app.hub
    else:
        config = load_config(*([args.config] if args.config else []))
        if not ray.is_initialized():
            ray.init(address=args.ray_address, namespace=HUB_NAMESPACE, log_to_driver=False)
        address, hub = args.address, find_hub(config)
        if hub is None:
            raise SystemExit(f"no worker hub for deployment {config.load_monitor.deployment!r} in that Ray cluster")
    try:
        slots = HubSlots(hub)
        num_slots = int(ray.get(hub.target_info.remote(), timeout=30)["num_slots"])
        reference = reference_outputs(address, PROMPTS)
        report = run(address, slots, PROMPTS, reference, args.count, args.concurrency or num_slots, num_slots)
    finally:
        if app is not None:
            app.shutdown()
    print(report.table())
    problems = report.failures()
    for problem in problems:
        print(f"FAILED: {problem}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
