"""The QPS sweep's report: what one request measured, each (QPS, policy) point pooled over
its runs, the tables, AUTO's verdict against the better fixed policy, and the two plots.

Pure (no server, no gRPC): `bench_load.py` plays the schedules and hands the requests here.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from bench_serving import percentile  # same percentile rule as the serving benchmark
from slo_report import slo_fields

POLICIES = ("on", "off", "auto")
GOALS = {"tokens_per_s": 0.95, "itl_p50_ms": 1.10, "itl_p99_ms": 1.10}  # AUTO / the better fixed policy


@dataclass
class RequestResult:
    arrival: float  # scheduled arrival, seconds after the run's start
    measured: bool  # arrived after the warm-up
    tokens: int = 0
    ttft: float = float("nan")
    latency: float = float("nan")  # sent to last token, seconds (TTFT and every ITL: the whole answer)
    itl: list[float] = field(default_factory=list)
    chunks: list[tuple[float, int]] = field(default_factory=list)  # (seconds after start, tokens)
    done: bool = False
    error: str = ""  # gRPC status name, "cancelled" (drain timeout) or ""
    drafted: int = 0
    accepted: int = 0
    gamma: int = 0
    speculation_enabled: bool = False


def one_token_rounds(done: list[RequestResult]) -> tuple[float, float]:
    """(share of the streamed chunks after each request's first that carried one token,
    median gap before those chunks in ms). Such a chunk is a round that kept no draft (every
    round of plain decoding; a speculative round whose first draft was rejected)."""
    gaps = [(b[0] - a[0], b[1]) for r in done for a, b in zip(r.chunks, r.chunks[1:])]
    single = [gap for gap, n in gaps if n == 1]
    return (len(single) / len(gaps) if gaps else float("nan"),
            1000 * statistics.median(single) if single else float("nan"))


def summarize(qps: float, policy: str, runs: list[tuple[list[RequestResult], list]], warmup: float,
              duration: float, tpot_target_ms: float | None = None, ttft_target_ms: float | None = None) -> dict:
    """One (QPS, policy) point over its runs (repeats of the schedule, pooled: every measured
    request of every run counts once), with its TPOT and SLO attainment (`slo_report`); the
    switch timeline shown is the first run's."""
    results = [r for run, _ in runs for r in run]
    measured = [r for r in results if r.measured]
    done = [r for r in measured if r.done]
    itl = [x for r in done for x in r.itl]
    window_tokens = sum(n for r in results for t, n in r.chunks if warmup <= t < warmup + duration)
    drafted = sum(r.drafted for r in done)
    accepted = sum(r.accepted for r in done)
    speculated = [r for r in done if r.drafted > 0 or r.speculation_enabled]
    measured_switch = [s for _, switch in runs for s in switch if warmup <= s[0] < warmup + duration]
    single_share, single_gap = one_token_rounds(done)
    return {
        "qps": qps,
        "policy": policy,
        "runs": len(runs),
        "sent": len(measured),
        "completed": len(done),
        "rejected": sum(r.error == "RESOURCE_EXHAUSTED" for r in measured),
        "failed": sum(bool(r.error) and r.error != "RESOURCE_EXHAUSTED" for r in measured),
        "duration_s": duration,
        "tokens_per_s": window_tokens / (duration * len(runs)),
        "ttft_p50_ms": 1000 * statistics.median(r.ttft for r in done) if done else float("nan"),
        "itl_p50_ms": 1000 * percentile(itl, 50),
        "itl_p99_ms": 1000 * percentile(itl, 99),
        "itl_mean_ms": 1000 * statistics.mean(itl) if itl else float("nan"),
        "latency_mean_ms": 1000 * statistics.mean(r.latency for r in done) if done else float("nan"),
        "one_token_chunk_share": single_share,
        "one_token_gap_p50_ms": single_gap,
        "acceptance": accepted / drafted if drafted else None,
        "drafted": drafted,
        "accepted": accepted,
        "speculated_fraction": len(speculated) / len(done) if done else float("nan"),
        "mean_gamma": statistics.mean(r.gamma for r in speculated) if speculated else 0.0,
        # from GetStats (when the server has it): share of the measured time the switch was on
        "switch_on_fraction": (sum(s[1] for s in measured_switch) / len(measured_switch)) if measured_switch else None,
        "switch_timeline": [{"t": round(t, 2), "on": on, "gamma": g, "qps": round(q, 2), "running": n}
                            for t, on, g, q, n, *_ in runs[0][1]] if runs else [],
        **slo_fields(measured, tpot_target_ms, ttft_target_ms),
    }


def fmt(x: float | None, spec: str = ".1f") -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def markdown(rows: list[dict]) -> str:
    lines = [
        "| QPS | policy | sent | done | rejected/failed | tokens/s | TTFT p50 (ms) | ITL p50 (ms) | ITL p99 (ms) "
        "| ITL mean (ms) | latency mean (ms) | 1-token chunks | their gap p50 (ms) | α | speculated "
        "| TPOT p50 (ms) | SLO met |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['qps']:g} | {r['policy']} | {r['sent']} | {r['completed']} | {r['rejected'] + r['failed']} "
            f"| {fmt(r['tokens_per_s'])} | {fmt(r['ttft_p50_ms'])} | {fmt(r['itl_p50_ms'])} | {fmt(r['itl_p99_ms'])} "
            f"| {fmt(r.get('itl_mean_ms'))} | {fmt(r.get('latency_mean_ms'), '.0f')} "
            f"| {fmt(100 * r['one_token_chunk_share'], '.0f')}% "
            f"| {fmt(r['one_token_gap_p50_ms'])} "
            f"| {fmt(r['acceptance'], '.2f')} | {fmt(100 * r['speculated_fraction'], '.0f')}% "
            f"| {fmt(r.get('tpot_p50_ms'))} | {_percent(r.get('slo_attainment'))} |"
        )
    return "\n".join(lines)


def _percent(x: float | None) -> str:
    return "–" if x is None else fmt(100 * x, ".0f") + "%"


def serves_the_load(r: dict) -> bool:
    """Every measured request completed, none rejected or failed."""
    return r["completed"] == r["sent"] and not r["rejected"] and not r["failed"]


def better_policy(on: dict, off: dict) -> dict:
    """The fixed policy a user would pick at this load: where both serve it (every request
    answered; their tokens/s then differ only by which tokens fell inside the measured
    interval), the one whose answers stream faster: the lower mean ITL (1 / a request's
    goodput); otherwise the one with more throughput."""
    if serves_the_load(on) and serves_the_load(off):
        return min((on, off), key=lambda r: r["itl_mean_ms"])
    return max((on, off), key=lambda r: r["tokens_per_s"])


def ratios(on: dict, off: dict, auto: dict, per_figure: bool = False) -> dict:
    """AUTO over the better fixed policy (`better_policy`) at every figure; with per_figure,
    over the better of ON and OFF at each figure on its own (throughput: the higher; each ITL
    figure: the lower), which asks AUTO for ON's p50 and OFF's p99 where each wins one."""
    better = None if per_figure else better_policy(on, off)
    out = {}
    for key in GOALS:
        pick = max if key == "tokens_per_s" else min
        reference = pick(on[key], off[key]) if better is None else better[key]
        out[key] = auto[key] / reference if reference else float("nan")
    return out


def met(r: dict) -> bool:
    return (r["tokens_per_s"] >= GOALS["tokens_per_s"] and r["itl_p50_ms"] <= GOALS["itl_p50_ms"]
            and r["itl_p99_ms"] <= GOALS["itl_p99_ms"])


CLOSENESS_HEADER = [
    "| QPS | ON / OFF tokens/s | ON / OFF mean ITL | ON / OFF mean latency | better "
    f"| AUTO / better tokens/s (≥ {GOALS['tokens_per_s']:.2f}) "
    f"| AUTO / better ITL p50 (≤ {GOALS['itl_p50_ms']:.2f}) | AUTO / better ITL p99 (≤ {GOALS['itl_p99_ms']:.2f}) "
    "| goals met "
    "| best tokens/s, ITL p50, p99 | AUTO / best ITL p50, p99 | met per figure | AUTO requests speculated |",
    "|---:|---:|---:|---:|---|---:|---:|---:|---|---|---|---|---:|",
]


def closeness(rows: list[dict], repeats: list[list[dict]] = ()) -> tuple[str, list[dict]]:
    """Per QPS: AUTO vs the better fixed policy (`better_policy`) on the pooled runs
    (throughput: goal ≥ 0.95; ITL p50 and p99: goal ≤ 1.10), each ratio with its range over
    the repeats (`repeats`: the rows of each repeat alone; a ratio of pooled figures need not
    lie between the repeats' ratios, which differ in size and speed); then, stricter, AUTO's
    ITL against the better of ON and OFF at each figure on its own (`best_by_figure`, e.g.
    "off, on, off": ON's p50 and OFF's p99) and whether the goals hold that way too."""
    by = {(r["qps"], r["policy"]): r for r in rows}
    each = [{(r["qps"], r["policy"]): r for r in rep} for rep in repeats]
    lines, out = list(CLOSENESS_HEADER), []
    for qps in sorted({r["qps"] for r in rows}):
        point = [by.get((qps, p)) for p in POLICIES]
        if not all(point):
            continue
        spread = [ratios(*(rep[(qps, p)] for p in POLICIES)) for rep in each
                  if all((qps, p) in rep for p in POLICIES)]
        c, line = _verdict(qps, *point, spread)
        out.append(c)
        lines.append(line)
    return "\n".join(lines), out


def _verdict(qps: float, on: dict, off: dict, auto: dict, spread: list[dict]) -> tuple[dict, str]:
    """One QPS's verdict (`closeness`) and its table line; `spread`: each repeat's ratios."""
    best = [max((on, off), key=lambda r: r["tokens_per_s"])["policy"],
            *(min((on, off), key=lambda r: r[k])["policy"] for k in ("itl_p50_ms", "itl_p99_ms"))]
    c = {"qps": qps, "better": better_policy(on, off)["policy"], "best_by_figure": best,
         "on_over_off": on["tokens_per_s"] / off["tokens_per_s"],
         "on_over_off_itl_mean": on["itl_mean_ms"] / off["itl_mean_ms"],
         "on_over_off_latency_mean": on.get("latency_mean_ms", math.nan) / off.get("latency_mean_ms", math.nan)}
    cells = []
    for key, value in ratios(on, off, auto).items():
        span = [min(r[key] for r in spread), max(r[key] for r in spread)] if spread else None
        c[f"auto_{key}_ratio"], c[f"auto_{key}_ratio_range"] = value, span
        cells.append(fmt(value, ".2f") + (f" ({span[0]:.2f}–{span[1]:.2f})" if span and len(spread) > 1 else ""))
    strict = ratios(on, off, auto, per_figure=True)
    c["auto_over_best_by_figure"] = strict
    c["auto_speculated_fraction"] = auto["speculated_fraction"]
    c["goals_met"] = met({k: c[f"auto_{k}_ratio"] for k in GOALS})
    c["goals_met_per_figure"] = met(strict)
    line = (f"| {qps:g} | {c['on_over_off']:.2f} | {c['on_over_off_itl_mean']:.2f} "
            f"| {fmt(c['on_over_off_latency_mean'], '.2f')} | {c['better']} "
            f"| {' | '.join(cells)} | {'yes' if c['goals_met'] else 'no'} | {', '.join(best)} "
            f"| {strict['itl_p50_ms']:.2f}, {strict['itl_p99_ms']:.2f} "
            f"| {'yes' if c['goals_met_per_figure'] else 'no'} "
            f"| {fmt(100 * c['auto_speculated_fraction'], '.0f')}% |")
    return c, line


def plot_timeline(rows: list[dict], path: Path, warmup: float) -> None:
    """AUTO's γ (largest given in the last round), on/off state and requests running over
    each run, one panel per QPS."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    autos = [r for r in rows if r["policy"] == "auto" and r["switch_timeline"]]
    if not autos:
        return
    fig, axes = plt.subplots(1, len(autos), figsize=(4.2 * len(autos), 3.6), squeeze=False)
    for ax, r in zip(axes[0], autos):
        tl = r["switch_timeline"]
        t = [s["t"] for s in tl]
        ax.step(t, [s["gamma"] for s in tl], where="post", color="tab:green", label="γ (largest this round)")
        ax.fill_between(t, 0, [8 if s["on"] else 0 for s in tl], step="post", color="tab:green", alpha=0.1,
                        label="speculation on")
        twin = ax.twinx()
        twin.plot(t, [s.get("running", 0) for s in tl], color="tab:gray", linewidth=1, label="requests running")
        twin.set_ylabel("requests running")
        ax.axvspan(0, warmup, color="k", alpha=0.05)
        ax.set_xlim(0, warmup + r["duration_s"] + 2)
        ax.set_ylim(0, 8.5)
        ax.set_title(f"{r['qps']:g} requests/s")
        ax.set_xlabel("seconds since the run started (grey: warm-up)")
        ax.set_ylabel("γ")
    axes[0][0].legend(loc="upper left", fontsize=8)
    fig.suptitle("AUTO: the goodput policy's γ and on/off state follow the load")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot(rows: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker  # noqa: F401  (matplotlib.ticker below)

    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2))
    panels = [("tokens_per_s", "throughput (tokens/s)", False), ("itl_p50_ms", "inter-token latency p50 (ms)", False),
              ("ttft_p50_ms", "time to first token p50 (ms)", True)]
    styles = {"on": ("tab:blue", "o", "speculation ON"), "off": ("tab:orange", "s", "speculation OFF"),
              "auto": ("tab:green", "^", "AUTO (load monitor)")}
    for ax, (key, label, log) in zip(axes, panels):
        for policy in POLICIES:
            pts = sorted((r["qps"], r[key]) for r in rows if r["policy"] == policy)
            if pts:
                color, marker, name = styles[policy]
                ax.plot(*zip(*pts), marker=marker, color=color, label=name,
                        linestyle="--" if policy == "auto" else "-", linewidth=2 if policy == "auto" else 1.5)
        ax.set_xlabel("offered load (requests/s)")
        ax.set_ylabel(label)
        if log:
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
            ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
