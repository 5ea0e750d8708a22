"""The QPS sweep's SLO attainment: the share of requests that met their latency targets, per
(QPS, policy), and AUTO's verdict against the better fixed policy on the goodput objective.

A request's time per output token (TPOT) is DistServe's (OSDI 2024): the time from its first
token to its last over the tokens after the first, (latency − TTFT) / (tokens − 1); a request
of one token has no gaps and meets any TPOT target. A request that failed, was rejected or
did not finish meets no target: attainment is over every measured request sent.

The goal (issue 37): at every load, AUTO's tokens/s ≥ 0.95 × the better fixed policy's and
its SLO attainment ≥ that policy's. The better fixed policy is the one a user with these
targets would pick: the higher attainment, at a tie the higher tokens/s.

Pure (no server, no gRPC): `bench_load.py` plays the schedules and hands the requests here.
"""

from __future__ import annotations

import math
import statistics

from bench_serving import percentile  # same percentile rule as the serving benchmark

TOKENS_GOAL = 0.95  # AUTO's tokens/s over the better fixed policy's, at least
POLICY_ORDER = ("on", "off", "auto")  # the order of each table's "ON / OFF / AUTO" cells


def request_tpot_s(r) -> float:
    """A finished request's seconds per output token after its first (nan: not finished)."""
    if not r.done:
        return math.nan
    return (r.latency - r.ttft) / (r.tokens - 1) if r.tokens > 1 else 0.0


def slo_fields(measured: list, tpot_target_ms: float | None, ttft_target_ms: float | None) -> dict:
    """TPOT percentiles of the finished requests and their scatter above the median
    (`tpot_scatter`, what the policy's TPOT_SCATTER assumes of a request around its row's
    predicted TPOT: the relative standard deviation of a normal scatter with the same p90,
    (p90 − p50) / 1.2816 / p50. The upper side, as a target is an upper bound: the lower one
    holds the run's light moments, rows whose predictions were lower too; a few stalled
    requests would move a standard deviation, not that); per target given, the
    share of all measured requests that finished within it; `slo_attainment`: within every
    target given (None without targets)."""
    tpots = [1000 * request_tpot_s(r) for r in measured if r.done]
    meets = [r.done for r in measured]
    out = {"tpot_p50_ms": percentile(tpots, 50), "tpot_p90_ms": percentile(tpots, 90),
           "tpot_scatter": _scatter(tpots), "tpot_target_ms": tpot_target_ms, "ttft_target_ms": ttft_target_ms}
    if tpot_target_ms is not None:
        within = [r.done and 1000 * request_tpot_s(r) <= tpot_target_ms for r in measured]
        out["tpot_attainment"] = _share(within)
        meets = [m and w for m, w in zip(meets, within)]
    if ttft_target_ms is not None:
        within = [r.done and 1000 * r.ttft <= ttft_target_ms for r in measured]
        out["ttft_attainment"] = _share(within)
        meets = [m and w for m, w in zip(meets, within)]
    targeted = tpot_target_ms is not None or ttft_target_ms is not None
    out["slo_attainment"] = _share(meets) if targeted else None
    return out


def _scatter(values: list[float]) -> float:
    """(p90 − p50) / 1.2816 / p50 (nan: fewer than two values or a zero median)."""
    if len(values) < 2 or not percentile(values, 50):
        return math.nan
    return (percentile(values, 90) - percentile(values, 50)) / 1.2816 / percentile(values, 50)


def _share(flags: list[bool]) -> float:
    return sum(flags) / len(flags) if flags else math.nan


def better_by_slo(on: dict, off: dict) -> dict:
    """The fixed policy with the higher SLO attainment (a tie: the higher tokens/s)."""
    return max((on, off), key=lambda r: (r["slo_attainment"], r["tokens_per_s"]))


def slo_verdict(on: dict, off: dict, auto: dict) -> dict:
    """AUTO against the better fixed policy (`better_by_slo`) at one load."""
    better = better_by_slo(on, off)
    ratio = auto["tokens_per_s"] / better["tokens_per_s"] if better["tokens_per_s"] else math.nan
    gap = auto["slo_attainment"] - better["slo_attainment"]
    return {"qps": auto["qps"], "better": better["policy"], "auto_tokens_per_s_ratio": ratio,
            "auto_minus_better_slo_attainment": gap,
            "slo_attainment": {r["policy"]: r["slo_attainment"] for r in (on, off, auto)},
            "goal_met": ratio >= TOKENS_GOAL and gap >= 0}


def _each(point: list[dict], key: str, spec: str) -> str:
    return " / ".join("–" if math.isnan(r[key]) else spec.format(r[key]) for r in point)


def _judged_points(rows: list[dict]):
    """(QPS, [ON, OFF, AUTO] rows, `slo_verdict`) for every load where all three carry an attainment."""
    by = {(r["qps"], r["policy"]): r for r in rows}
    for qps in sorted({r["qps"] for r in rows}):
        point = [by.get((qps, p)) for p in POLICY_ORDER]
        if all(point) and all(r.get("slo_attainment") is not None for r in point):
            yield qps, point, slo_verdict(*point)


def slo_table(rows: list[dict]) -> tuple[str, list[dict]]:
    """Per QPS: tokens/s, TPOT p50 and SLO attainment of ON / OFF / AUTO, AUTO's tokens/s over
    the better fixed policy's and its attainment less that policy's; ("", []) without targets."""
    lines = ["| QPS | tokens/s ON / OFF / AUTO | TPOT p50 ms ON / OFF / AUTO | SLO attainment ON / OFF / AUTO "
             f"| better | AUTO / better tokens/s (≥ {TOKENS_GOAL:.2f}) | AUTO − better attainment (≥ 0) | goal met |",
             "|---:|---|---|---|---|---:|---:|---|"]
    out = []
    for qps, point, v in _judged_points(rows):
        out.append(v)
        lines.append(f"| {qps:g} | {_each(point, 'tokens_per_s', '{:.0f}')} | {_each(point, 'tpot_p50_ms', '{:.1f}')} "
                     f"| {_each(point, 'slo_attainment', '{:.0%}')} | {v['better']} "
                     f"| {v['auto_tokens_per_s_ratio']:.2f} | {100 * v['auto_minus_better_slo_attainment']:+.0f} pp "
                     f"| {'yes' if v['goal_met'] else 'no'} |")
    return ("\n".join(lines), out) if out else ("", [])


def _range(values: list[float]) -> tuple[float, float]:
    return (min(values), max(values)) if values else (math.nan, math.nan)


def spread_verdict(qps: float, verdict: dict, repeats: list[dict]) -> dict:
    """One load's verdict with its noise (`slo_spread`); repeats: each repeat's rows by (QPS, policy)."""
    better = verdict["better"]
    reps = [rep for rep in repeats if all((qps, p) in rep for p in POLICY_ORDER)]
    spans = {p: _range([rep[(qps, p)]["slo_attainment"] for rep in reps]) for p in POLICY_ORDER}
    gaps = [rep[(qps, "auto")]["slo_attainment"] - rep[(qps, better)]["slo_attainment"] for rep in reps]
    ratios = [rep[(qps, "auto")]["tokens_per_s"] / rep[(qps, better)]["tokens_per_s"] for rep in reps
              if rep[(qps, better)]["tokens_per_s"]]
    mean = statistics.mean(gaps) if gaps else math.nan
    se = statistics.stdev(gaps) / math.sqrt(len(gaps)) if len(gaps) > 1 else math.nan
    short = verdict["auto_minus_better_slo_attainment"] < 0
    beyond = short and (mean + 2 * se < 0 if len(gaps) > 1 else True)  # one repeat: no noise measured
    nobody = all(a == 0 for a in verdict["slo_attainment"].values())  # the target out of every policy's reach
    judged = "void: no policy met the target" if nobody else "met" if verdict["goal_met"] else (
        "missed" if verdict["auto_tokens_per_s_ratio"] < TOKENS_GOAL or beyond else "within noise")
    return {**verdict, "verdict": judged, "attainment_range": spans, "paired_gaps": gaps, "paired_gap_mean": mean,
            "paired_gap_se": se, "tokens_per_s_ratios": ratios}


def slo_spread(rows: list[dict], repeats: list[list[dict]]) -> tuple[str, list[dict]]:
    """Per QPS, how far the verdict can be trusted: each policy's attainment range over the
    repeats (the machine's noise: one policy's runs alike but for when they ran), and AUTO's
    paired gap, AUTO − the better fixed policy (chosen on the pooled runs, `better_by_slo`)
    within each repeat, where the two ran minutes apart on the same schedule: its mean, ±2
    standard errors and range, and AUTO's tokens/s ratio per repeat. The verdict: "met"
    (pooled: tokens/s ≥ 0.95× and attainment ≥ the better's), "missed" (tokens/s short, or
    the pooled gap below 0 and the paired gaps' mean + 2 standard errors too: beyond the
    noise; with a single repeat no noise is measured and a shortfall is a miss), else
    "within noise"; "void" where no policy met the target at all (0 % ≥ 0 % says nothing).
    ("", []) without targets."""
    each = [{(r["qps"], r["policy"]): r for r in rep} for rep in repeats]
    lines = ["| QPS | attainment ON / OFF / AUTO (pooled) | its range over the repeats ON; OFF; AUTO | better "
             "| AUTO / better tokens/s (repeats) | AUTO − better attainment pooled | paired per repeat: "
             "mean ± 2 SE (range) | verdict |",
             "|---:|---|---|---|---|---:|---|---|"]
    out = []
    for qps, point, v in _judged_points(rows):
        c = spread_verdict(qps, v, each)
        out.append(c)
        gaps, ratios = c["paired_gaps"], c["tokens_per_s_ratios"]
        span = "; ".join(f"{100 * lo:.0f}–{100 * hi:.0f}%" for lo, hi in c["attainment_range"].values())
        ratio_span = f"{v['auto_tokens_per_s_ratio']:.2f}"
        ratio_span += f" ({min(ratios):.2f}–{max(ratios):.2f})" if ratios else ""
        paired = (f"{100 * c['paired_gap_mean']:+.0f} ± {200 * c['paired_gap_se']:.0f} pp "
                  f"({100 * min(gaps):+.0f} to {100 * max(gaps):+.0f})" if len(gaps) > 1 else "–")
        lines.append(f"| {qps:g} | {_each(point, 'slo_attainment', '{:.0%}')} | {span} | {v['better']} | {ratio_span} "
                     f"| {100 * v['auto_minus_better_slo_attainment']:+.0f} pp | {paired} | {c['verdict']} |")
    return ("\n".join(lines), out) if out else ("", [])


def target_effect(rows: list[dict], repeats: list[list[dict]], untargeted: str = "auto-free") -> str:
    """Per QPS where the sweep ran both: AUTO with the TPOT target against AUTO without it
    (`untargeted`, judged at the same target), pooled and paired within each repeat; "" otherwise."""
    by = {(r["qps"], r["policy"]): r for r in rows}
    lines = []
    for qps in sorted({r["qps"] for r in rows}):
        with_t, without = by.get((qps, "auto")), by.get((qps, untargeted))
        if not with_t or not without or with_t.get("slo_attainment") is None:
            continue
        gaps = [rep_by[(qps, "auto")]["slo_attainment"] - rep_by[(qps, untargeted)]["slo_attainment"]
                for rep_by in ({(r["qps"], r["policy"]): r for r in rep} for rep in repeats)
                if (qps, "auto") in rep_by and (qps, untargeted) in rep_by]
        paired = f"{100 * min(gaps):+.0f} to {100 * max(gaps):+.0f} pp" if gaps else "–"
        lines.append(f"| {qps:g} | {with_t['slo_attainment']:.0%} / {without['slo_attainment']:.0%} "
                     f"| {with_t['tpot_p50_ms']:.1f} / {without['tpot_p50_ms']:.1f} "
                     f"| {with_t['tokens_per_s']:.0f} / {without['tokens_per_s']:.0f} | {paired} |")
    if not lines:
        return ""
    return "\n".join(["| QPS | attainment AUTO / without target | TPOT p50 ms | tokens/s | paired per repeat |",
                      "|---:|---|---|---|---|", *lines])
