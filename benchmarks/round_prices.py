"""Each kind of round's measured parts against the cost model's predictions of them (`round_kinds.py`).

Per kind of full round (≥ 24 rows: plain, and drafting by its draft steps; rounds that read
a prompt apart from those that read none): the target's
verify, the proposer's call and the rest of the round as measured, beside what the cost
model that priced the round predicts from the round's own shape (rows, drafted tokens,
prompt tokens, draft rows, steps, catch-up), the calibration scale of its kind, and
measured / predicted of the whole round (calibrated, as the plan prices it), and against
the decoding round the plan judged its tokens/s and TPOT on (`Decision.decode_s`: no
prompts, each row's catch-up as the plan charged it, not as the draft read it). Also the
tokens the round emitted against the plan's tokens/s times its decoding round.
"""

from __future__ import annotations

import numpy as np


PRICED: dict[float, object] = {}  # a priced decision's planned seconds -> the cost model that priced it


def record_prices() -> None:
    """Keep the cost model behind every priced decision (`SpeculationPolicy._priced`), to set
    each round's measured parts against what that model predicted of them."""
    from specdec.policy.speculation_policy import SpeculationPolicy

    original = SpeculationPolicy._priced

    def priced(decision, snapshot, rows, explore, catch_up):
        out = original(decision, snapshot, rows, explore, catch_up)
        if out.planned_s > 0:
            PRICED[out.planned_s] = snapshot.round_cost
        return out
    SpeculationPolicy._priced = staticmethod(priced)


def price_rows(rounds: list[dict], min_rows: int = 24) -> dict[str, dict]:
    """Mean measured and predicted milliseconds per kind of priced round of at least `min_rows` rows."""
    priced = [r for r in rounds if r.get("priced") and r["priced"]["rows"] >= min_rows]
    out: dict[str, dict] = {}
    for key in sorted({_kind(r["priced"]) for r in priced}):
        group = [r for r in priced if _kind(r["priced"]) == key]
        p = [r["priced"] for r in group]

        def mean(name: str, p: list[dict] = p) -> float:
            return 1000 * float(np.mean([x[name] for x in p]))
        rest = 1000 * float(np.mean([x["round_s"] - x["verify_s"] - x["draft_s"] for x in p]))
        calibrated = 1000 * float(np.mean([x["scale"] * x["planned_s"] for x in p]))
        predicted_tokens = [x["goodput"] * x["decode_s"] for x in p if x["goodput"] > 0]
        out[key] = {"rounds": len(p), "rows": float(np.mean([x["rows"] for x in p])),
                    "catch_up": float(np.mean([x["catch_up"] for x in p])),
                    "prompt_tokens": float(np.mean([x["prompt_tokens"] for x in p])),
                    "verify": mean("verify_s"), "verify_pred": mean("verify_pred"),
                    "draft": mean("draft_s"), "draft_pred": mean("draft_pred"),
                    "rest": rest, "overhead_pred": mean("overhead_pred"),
                    "round": mean("round_s"), "base_pred": mean("planned_s"),
                    "scale": float(np.mean([x["scale"] for x in p])),
                    "calibrated": calibrated, "ratio": mean("round_s") / calibrated if calibrated > 0 else 0.0,
                    "decode": mean("decode_s"),
                    "emitted": float(np.mean([r["emitted"] for r in group])),
                    "tokens_pred": float(np.mean(predicted_tokens)) if predicted_tokens else 0.0}
    return out


def _kind(priced: dict) -> str:
    """The round's kind, and whether it read a prompt: the plan prices decoding rounds, so
    the prompt-free rounds are where its choice between γ 0 and γ > 0 is priced."""
    kind = f"drafting γ{priced['steps']}" if priced["drafting"] else "plain"
    return f"{kind}, {'prompts' if priced['prompt_tokens'] > 0 else 'no prompt'}"


def print_prices(table: dict[str, dict]) -> None:
    print("| round (≥ 24 rows) | rounds | rows | catch-up | prompt tokens | verify ms meas / pred |"
          " draft ms meas / pred |"
          " rest ms meas / pred | round ms meas | base pred | scale | calibrated pred | meas / pred |"
          " plan's decoding round ms | tokens emitted / plan's |")
    print("|---|---:|---:|---:|---:|---|---|---|---:|---:|---:|---:|---:|---:|---|")
    for key, t in table.items():
        print(f"| {key} | {t['rounds']} | {t['rows']:.1f} | {t['catch_up']:.1f} | {t['prompt_tokens']:.0f} | "
              f"{t['verify']:.1f} / {t['verify_pred']:.1f} | {t['draft']:.1f} / {t['draft_pred']:.1f} | "
              f"{t['rest']:.1f} / {t['overhead_pred']:.1f} | {t['round']:.1f} | {t['base_pred']:.1f} | "
              f"{t['scale']:.2f} | {t['calibrated']:.1f} | {t['ratio']:.2f} | {t['decode']:.1f} | "
              f"{t['emitted']:.1f} / {t['tokens_pred']:.1f} |")
