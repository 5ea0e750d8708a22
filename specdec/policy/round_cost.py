"""What a round costs at the current batch: a linear model learnt online from round timings.

A round runs one proposer call (γ draft steps for the rows that draft) and one target
forward over every row's pending token and drafted tokens, plus fixed bookkeeping. In
seconds:

    verify_s ≈ v_fixed + v_row · rows + v_drafted · drafted + v_prompt · prompt tokens
               + v_speculating (when the round verifies any draft)
               + v_prompt_round (when the round reads any prompt)
    draft_s  ≈ d_fixed + d_step · steps + d_row_step · draft_rows · steps + d_catch_up · catch_up
    round_s  ≈ verify_s + draft_s (0 when nobody drafts) + overhead_s

(SmartSpec, "Optimizing Speculative Decoding for Serving LLMs Using Goodput", 2024, fits a
batch's time as a linear function of its tokens in the same way.) Each term is there because
a model without it misprices a choice the plan makes (docs/speculation_policy.md):
* a row brings its own attention, sampling and bookkeeping; a drafted token only lengthens
  its row's forward; a newcomer's prompt is read in one batched forward. One price for rows
  and drafted tokens, fitted on mostly plain rounds, prices drafting far too dear; where the
  rounds cannot tell the two apart a small penalty makes them equal (`DRAFTED_TIE`);
* v_speculating: what verifying any draft costs once (the proposal's transfer, the rejection
  sampler's setup, a look-ahead sharing the verify's cores); spread over drafted tokens it
  keeps speculation off where it pays. Where every round verified drafts, a ridge gives it
  to v_fixed (`VERIFY_RIDGE`);
* v_prompt_round: what reading any prompt costs a round once (the prompts' own forward
  beside the decoding rows'). A prompt's price is a step, not a slope: spread over its
  tokens by v_prompt alone, the step leaks into the decoding prices (every prompt-free
  round predicted dear, and by how much depends on each kind's share of prompt rounds, so
  plain rows were priced apart from drafting rows by the traffic's mix, not by their cost).
  Where every prompt is as long as the others the two cannot be told apart, and a ridge
  gives the step to v_prompt (`VERIFY_RIDGE`);
* d_catch_up: the history a row's draft reads before drafting (its whole prompt, or what was
  decoded plainly since it last drafted); without it the dear first calls of rows that draft
  now and then read as a fixed cost of every call.

The coefficients are fitted by non-negative least squares over additive sums (Σ x·xᵀ, Σ x·y,
n), so the sums of any number of router replicas and time buckets merge by adding
(`StatsWindow` in Redis). Draft calls at one γ cannot separate the call's fixed cost from its
steps'; a ridge then gives it to the steps (`DRAFT_RIDGE`), so a shorter γ is predicted
cheaper and gets tried. A round's cost belongs to the deployment, not to the moment's load:
its sums are kept over the longer cost window (`load_monitor.cost_window_s`, `COST_KEYS`).

A linear fit is trusted only near the rounds it was fitted on. `drafted_limit`, the trust
region, is the most drafted tokens a round may plan: the largest forward seen in at least
EDGE_ROUNDS rounds (counted per quarter octave, so counts add up) and a quarter more. Plans
stay inside it and their rounds widen it, so speculation grows into a new regime step by step.

The parts' sum misses what the parts do to each other (a look-ahead made during the previous
verify, two workers sharing cores, a worker woken from idle), so each planned round's
prediction (`base_round_s`) is summed with its actual seconds, apart for drafting and plain
rounds, and predictions are scaled by actual / predicted of their kind (`drafting_scale`,
`plain_scale`; shrunk towards 1 by CALIBRATION_PRIOR_S of rounds, within CALIBRATION_LIMITS).
Only rounds that read no prompt calibrate: the plan prices decoding rounds (prompts are sunk
for it), and a prompt's price is the linear fit's least certain part (its step and its
per-token price, from whatever prompts the window held). Counted with the rest, the prompt
rounds' error became their kind's: under AUTO at a full batch the few
plain rounds were mostly rounds that read a long prompt, so plain decoding was calibrated
on them and priced dear.

A row's time per output token is more than the rounds its plan predicts: rounds that read
newcomers' prompts (sunk for the plan, not for the row), rounds it sits out (a prefill
chunk's budget, the other micro-batch's turn), the engine between rounds. So the engine
also times, for every row a priced round emits for, the seconds since that row last emitted
(`add_row_waits`), beside the decoding round its plan predicted (`round_s` without
prompts), and `wait_scale` (measured / predicted, shrunk towards 1
by WAIT_PRIOR_S of row-rounds) turns a plan's decoding round into what its rows wait per
round: the TPOT targets are judged on that (`specdec.policy.gamma`). A ratio, not an added
term: prompts arrive per second, not per round, so their share of a row's wait is a share
of its time whatever the round's length, as is a micro-batch's turn.

Plain decoding's own longest rounds read a newcomer's prompt; the model keeps the mean such
prompt (`prompt_tokens`) so that a round-time bound can be set against that round
(`prefill_round_s`): speculation may not stretch a gap past those plain decoding has anyway.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

import numpy as np

# The target's sums are kept under "target" (features 1, rows, drafted, prompt tokens, whether
# any draft was verified, whether any prompt was read); routers before the row / drafted split
# added "verify" sums of (1, tokens, prompt tokens), which this model does not read (they leave
# the load window within window_s of an upgrade); routers before one of the last two features
# add none for it (their drafting / prompt rounds read as other rounds for that term until
# they leave the cost window).
VERIFY, DRAFT = "target", "draft"
PREFILL = "prefill"
CALIBRATION = "calibration"
WAITS = "row_waits"
# the sums `add_round_timing` and `add_row_waits` add
COST_KEYS = (f"{VERIFY}:", f"{DRAFT}:", f"{PREFILL}:", f"{CALIBRATION}:", f"{WAITS}:", "cost_rounds",
             "overhead_seconds")
MIN_ROUNDS, MIN_DRAFT_CALLS = 16, 4  # timings needed before the model is trusted at all
CALIBRATION_PRIOR_S = 0.5  # a kind's scale counts this many seconds of rounds measured as predicted
CALIBRATION_LIMITS = (0.25, 4.0)  # a scale outside these says the model is broken, not biased
WAIT_PRIOR_S = 2.0  # row-rounds' seconds the wait scale counts as measured as predicted (a few rounds of a batch)
RIDGE = 1e-8  # relative to each feature's own Σ x²: splits collinear features, biases nothing else
# The draft's fixed and per-row-step terms are penalised more than its per-step term. While
# every call had the same number of rows (one request at a time) the per-row-step term cannot
# be told from the per-step one, and a step's cost is then taken as the batch's, not as
# growing with rows that were never measured. While every call drafted the same γ (mode ON
# traffic) the call's fixed cost cannot be told from its steps', and the cost is then taken
# as the steps': a shorter γ is predicted cheaper, as an autoregressive draft is, so the plan
# (and its round-time bound) still tries it and measures the truth; taken as fixed, every
# shorter γ would look as dear as the measured one and speculation would stop altogether.
DRAFT_RIDGE = (1e-6, RIDGE, 1e-4, 1e-4)  # the catch-up term, like the per-row one, only where measured apart
# The target's speculating term goes to its fixed cost where the two cannot be told apart
# (every round verified drafts), and costs nothing where they can; its prompt-round term goes
# to the per-prompt-token price where every prompt had one length.
VERIFY_RIDGE = (RIDGE, RIDGE, RIDGE, RIDGE, 1e-4, 1e-4)
# The target's per-row and per-drafted-token prices are pulled together by this weight
# (relative to Σ rows²): nothing where drafted tokens vary apart from rows, one price where they do not.
DRAFTED_TIE = 1e-3
EDGE_ROUNDS = 4  # rounds (calls) measured at or beyond a forward's size before it is inside the trust region
EDGE_BINS = 4  # the trust region's counts are kept in bins of 2^(1/EDGE_BINS) (quarter octaves)


@dataclass(frozen=True)
class RoundShape:
    """What a round's cost depends on.

    rows: sequences verified; tokens: Σ (drafted_i + 1) over them, plus the prompt tokens of
    rows in their first round; draft_rows: rows the proposer was asked to draft for; steps:
    the largest γ asked (draft steps run in turn); catch_up: tokens of those rows' histories
    the proposer had not seen; prompts, prompt_tokens: the rows in their first round and
    their prompts' tokens (part of tokens).
    """

    rows: int
    tokens: int
    draft_rows: int
    steps: int
    catch_up: int = 0
    prompts: int = 0
    prompt_tokens: int = 0

    @property
    def drafted(self) -> int:
        """Drafted tokens verified (tokens less the rows' pending tokens and the prompts)."""
        return self.tokens - self.rows - self.prompt_tokens

    def verify_features(self) -> tuple[float, float, float, float, float, float]:
        return (1.0, float(self.rows), float(self.drafted), float(self.prompt_tokens), float(self.drafted > 0),
                float(self.prompt_tokens > 0))

    def draft_features(self) -> tuple[float, float, float, float]:
        return (1.0, float(self.steps), float(self.draft_rows * self.steps), float(self.catch_up))


def add_point(add: Callable[[str, float], None], prefix: str, x: tuple[float, ...], y: float) -> None:
    """Add one observation y ≈ w · x to the least-squares sums under `prefix`."""
    add(f"{prefix}:n", 1.0)
    for i, xi in enumerate(x):
        add(f"{prefix}:xy:{i}", xi * y)
        for j in range(i, len(x)):
            add(f"{prefix}:xx:{i}:{j}", xi * x[j])


def fit_nonnegative(sums: Mapping[str, float], prefix: str, k: int,
                    ridge: tuple[float, ...] | None = None,
                    tie: tuple[int, int, float] | None = None,
                    features: tuple[int, ...] | None = None) -> tuple[float, ...] | None:
    """w ≥ 0 minimising Σ (y − w · x)² + Σ ridge_i · Σx_i² · w_i² (+ with tie = (i, j, λ),
    λ · Σx_i² · (w_i − w_j)²) from the sums under `prefix` (None without data), over the
    first k features, or over `features` alone (indices below k; the others get 0). Active
    set: solve, drop the most negative coefficient, solve again."""
    if sums.get(f"{prefix}:n", 0.0) <= 0:
        return None
    a = np.zeros((k, k))
    b = np.array([sums.get(f"{prefix}:xy:{i}", 0.0) for i in range(k)])
    for i in range(k):
        for j in range(i, k):
            a[i, j] = a[j, i] = sums.get(f"{prefix}:xx:{i}:{j}", 0.0)
    scale = np.maximum(np.diag(a), 1e-12)
    a += np.diag(scale * np.asarray((ridge or (RIDGE,) * k)[:k]))
    if tie is not None and max(tie[:2]) < k:
        i, j, weight = tie
        pull = weight * scale[i]
        a[i, i] += pull
        a[j, j] += pull
        a[i, j] -= pull
        a[j, i] -= pull
    active = list(range(k) if features is None else features)
    w = np.zeros(k)
    while active:
        sub = np.linalg.solve(a[np.ix_(active, active)], b[active])
        if (sub >= 0).all():
            w[:] = 0.0
            w[active] = sub
            break
        active.pop(int(np.argmin(sub)))
    return tuple(float(v) for v in w)


@dataclass(frozen=True)
class RoundCostModel:
    """Predicted seconds of a round's parts (coefficients in seconds, all ≥ 0).

    verify: (v_fixed, v_row, v_drafted, v_prompt, v_speculating, v_prompt_round), the last
    two 0 when left out; (v_fixed, v_token[, v_prompt]) prices a row, a drafted token (and a
    prompt token, when left out) alike; draft: (d_fixed, d_step,
    d_row_step, d_catch_up), the last 0 when left out; overhead_s: the rest of a round
    (router bookkeeping, streaming), per round.
    """

    verify: tuple[float, ...]
    draft: tuple[float, ...]
    overhead_s: float = 0.0
    verify_tokens_high: float = float("inf")  # trust region: verified tokens per round measured up to about this
    draft_tokens_high: float = float("inf")  # ... and drafted tokens (draft rows × γ) per call
    prompt_tokens: float = 0.0  # a newcomer's mean prompt, in tokens, as measured (0 = none seen)
    drafting_scale: float = 1.0  # measured / predicted seconds of planned rounds that verified drafts
    plain_scale: float = 1.0  # ... and of planned plain rounds
    wait_scale: float = 1.0  # a row's measured seconds between its emissions / its plan's decoding round

    def __post_init__(self) -> None:
        if len(self.verify) in (2, 3):  # one price for a row and a drafted token
            fixed, token, *prompt = self.verify
            object.__setattr__(self, "verify", (fixed, token, token, prompt[0] if prompt else token))
        if len(self.verify) in (4, 5):
            object.__setattr__(self, "verify", (*self.verify, *(0.0,) * (6 - len(self.verify))))
        if len(self.draft) == 3:
            object.__setattr__(self, "draft", (*self.draft, 0.0))
        if len(self.verify) != 6 or len(self.draft) != 4:
            raise ValueError(f"need 2 to 6 verify and 3 or 4 draft coefficients, got {self.verify}, {self.draft}")
        if min(*self.verify, *self.draft, self.overhead_s) < 0:
            raise ValueError(f"round cost coefficients must be >= 0, got {self}")
        if min(self.drafting_scale, self.plain_scale, self.wait_scale) <= 0:
            raise ValueError(f"calibration scales must be > 0, got {self.drafting_scale}, {self.plain_scale}, "
                             f"{self.wait_scale}")

    @classmethod
    def from_sums(cls, sums: Mapping[str, float]) -> "RoundCostModel | None":
        """The model fitted from `add_round_timing` sums; None until the target was timed in
        MIN_ROUNDS rounds and the proposer in MIN_DRAFT_CALLS calls (a fit on a handful of
        rounds is noise, and speculation's cost is unknown before the proposer ran)."""
        if sums.get(f"{VERIFY}:n", 0.0) < MIN_ROUNDS or sums.get(f"{DRAFT}:n", 0.0) < MIN_DRAFT_CALLS:
            return None
        prompts_read = sums.get(f"{VERIFY}:xx:3:3", 0.0) > 0  # else a prompt token is priced as a row
        drafts_read = sums.get(f"{VERIFY}:xx:4:4", 0.0) > 0  # else verifying drafts costs nothing apart
        prompt_rounds = sums.get(f"{VERIFY}:xx:5:5", 0.0) > 0  # else reading a prompt costs nothing apart
        features = ((0, 1, 2) + ((3,) if prompts_read else ()) + ((4,) if drafts_read else ())
                    + ((5,) if prompts_read and prompt_rounds else ()))
        verify = fit_nonnegative(sums, VERIFY, 6, VERIFY_RIDGE, (1, 2, DRAFTED_TIE), features)
        draft = fit_nonnegative(sums, DRAFT, 4, DRAFT_RIDGE)
        if verify is None or draft is None or sum(verify) <= 0:
            return None
        if not prompts_read:
            verify = (*verify[:3], verify[1], *verify[4:])
        rounds = sums.get("cost_rounds", 0.0)
        overhead = sums.get("overhead_seconds", 0.0) / rounds if rounds > 0 else 0.0
        prompts = sums.get(f"{PREFILL}:rows", 0.0)
        prompt_tokens = sums.get(f"{PREFILL}:tokens", 0.0) / prompts if prompts > 0 else 0.0
        return cls(verify, draft, max(0.0, overhead), _edge(sums, VERIFY), _edge(sums, DRAFT),
                   prompt_tokens, _scale(sums, "drafting"), _scale(sums, "plain"), _wait_scale(sums))

    def with_drafting_of(self, measured: "RoundCostModel") -> "RoundCostModel":
        """This model's plain-round prices with `measured`'s prices of drafting, and the two
        trust regions joined: for a window that holds too few drafts to re-measure them
        (speculation off: exploration only), beside a model fitted while rows drafted. A
        drafting round's verify keeps `measured`'s fixed cost (v_fixed + v_speculating; the
        latter is folded into v_fixed where every round drafted), a plain one this model's."""
        v, m = self.verify, measured.verify
        speculating = max(0.0, m[0] + m[4] - v[0])
        return replace(self, verify=(v[0], v[1], m[2], v[3], speculating, v[5]), draft=measured.draft,
                       verify_tokens_high=max(self.verify_tokens_high, measured.verify_tokens_high),
                       draft_tokens_high=max(self.draft_tokens_high, measured.draft_tokens_high),
                       drafting_scale=measured.drafting_scale)

    def drafted_limit(self, rows: int) -> float:
        """The most tokens a round of `rows` rows may draft in all (the trust region)."""
        return max(0.0, min(self.verify_tokens_high - rows, self.draft_tokens_high))

    def verify_s(self, rows: float, drafted: float = 0.0, prompt_tokens: float = 0.0) -> float:
        """The target's call for `rows` rows with `drafted` drafted tokens in all, also reading
        `prompt_tokens` of newcomers' prompts."""
        v = self.verify
        return (v[0] + v[1] * rows + v[2] * drafted + v[3] * prompt_tokens + (v[4] if drafted > 0 else 0.0)
                + (v[5] if prompt_tokens > 0 else 0.0))

    def draft_s(self, draft_rows: float, steps: float, catch_up: float = 0.0) -> float:
        if draft_rows <= 0 or steps <= 0:
            return 0.0
        d = self.draft
        return d[0] + d[1] * steps + d[2] * draft_rows * steps + d[3] * catch_up

    def round_s(self, gammas: list[int] | tuple[int, ...], prompt_tokens: float = 0,
                catch_up: list[int] | tuple[int, ...] | None = None) -> float:
        """Predicted seconds of a round in which row i drafts gammas[i] tokens (reading
        catch_up[i] tokens of its history first) and the target also reads `prompt_tokens`
        (the prompts of rows in their first round), calibrated by what such rounds took."""
        scale = self.drafting_scale if any(g > 0 for g in gammas) else self.plain_scale
        return scale * self.base_round_s(gammas, prompt_tokens, catch_up)

    def base_round_s(self, gammas: list[int] | tuple[int, ...], prompt_tokens: float = 0,
                     catch_up: list[int] | tuple[int, ...] | None = None) -> float:
        """`round_s` from the parts alone (uncalibrated): what a plan records as predicted."""
        drafting = [g for g in gammas if g > 0]
        read = sum(c for g, c in zip(gammas, catch_up) if g > 0) if catch_up is not None else 0
        return (self.overhead_s + self.verify_s(len(gammas), sum(gammas), prompt_tokens)
                + self.draft_s(len(drafting), max(drafting, default=0), read))

    def row_wait_s(self, gammas: list[int] | tuple[int, ...],
                   catch_up: list[int] | tuple[int, ...] | list[float] | None = None) -> float:
        """Predicted seconds a row of this plan waits per round: the decoding round (`round_s`
        without prompts) scaled by what rows waited per such round (`wait_scale`)."""
        return self.wait_scale * self.round_s(gammas, 0, catch_up)

    def plain_rows_for(self, tokens_per_s: float) -> float:
        """The rows plain decoding keeps in flight while it emits `tokens_per_s` (Little's law:
        each row emits one token per round, so N = tokens_per_s · round_s(N) with round_s(N)
        = a + b · N, N = D · a / (1 − D · b)); inf where plain decoding cannot keep up."""
        a = self.round_s([])  # the round's cost without a row
        b = self.plain_scale * self.verify[1]  # ... and each row's
        room = 1.0 - tokens_per_s * b
        return tokens_per_s * a / room if room > 0 else float("inf")

    def prefill_round_s(self, gammas: list[int] | tuple[int, ...], prompt_tokens: int = 0) -> float:
        """Predicted seconds of the round in which these rows also read `prompt_tokens` or,
        when that is less, one newcomer's mean prompt: plain decoding's long rounds."""
        return self.round_s(gammas, max(float(prompt_tokens), self.prompt_tokens))


def _edge(sums: Mapping[str, float], prefix: str) -> float:
    """The top of the trust region for the forwards counted under `prefix` (verified tokens
    per round, drafted tokens per call): the upper end of the largest bin with EDGE_ROUNDS
    rounds at or beyond it, plus a quarter (at least 2 tokens) to grow into; 0 when none."""
    key = f"{prefix}:edge:"
    counts = sorted(((int(k[len(key):]), v) for k, v in sums.items() if k.startswith(key)), reverse=True)
    seen = 0.0
    for bin_, count in counts:
        seen += count
        if seen >= EDGE_ROUNDS:
            top = 2.0 ** ((bin_ + 1) / EDGE_BINS)
            return top + max(2.0, 0.25 * top)
    return 0.0


def _add_edge(add: Callable[[str, float], None], prefix: str, tokens: int) -> None:
    """Count one forward of `tokens` (≥ 1) in its bin of the trust region."""
    add(f"{prefix}:edge:{int(np.floor(EDGE_BINS * np.log2(max(1, tokens))))}", 1.0)


def _scale(sums: Mapping[str, float], kind: str) -> float:
    """Measured / predicted seconds of the planned rounds of one kind, shrunk towards 1."""
    planned = sums.get(f"{CALIBRATION}:{kind}:planned", 0.0)
    measured = sums.get(f"{CALIBRATION}:{kind}:measured", 0.0)
    low, high = CALIBRATION_LIMITS
    return min(high, max(low, (measured + CALIBRATION_PRIOR_S) / (planned + CALIBRATION_PRIOR_S)))


def _wait_scale(sums: Mapping[str, float]) -> float:
    """Seconds rows waited between emissions / the decoding rounds their plans predicted,
    shrunk towards 1 by WAIT_PRIOR_S, within CALIBRATION_LIMITS."""
    waited, planned = sums.get(f"{WAITS}:measured", 0.0), sums.get(f"{WAITS}:planned", 0.0)
    low, high = CALIBRATION_LIMITS
    return min(high, max(low, (waited + WAIT_PRIOR_S) / (planned + WAIT_PRIOR_S)))


def add_row_waits(add: Callable[[str, float], None], rows: int, waited_s: float, decode_s: float) -> None:
    """Add one priced round's row waits: `rows` rows emitted that had emitted before, waiting
    `waited_s` seconds in all since their last emission; the plan predicted a decoding round
    of `decode_s` seconds (`RoundCostModel.round_s` without prompts)."""
    if rows > 0 and decode_s > 0:
        add(f"{WAITS}:measured", waited_s)
        add(f"{WAITS}:planned", rows * decode_s)


def is_cost_key(key: str) -> bool:
    """Whether a sum belongs to the round cost model (kept over the longer cost window)."""
    return key.startswith(COST_KEYS)


def add_round_timing(add: Callable[[str, float], None], shape: RoundShape, verify_s: float, draft_s: float,
                     round_s: float, planned_s: float = 0.0) -> None:
    """Add one round's timings to the sums `RoundCostModel.from_sums` reads; planned_s: the
    round's seconds as its plan predicted them (`base_round_s`; 0 = not a priced plan)."""
    if shape.rows <= 0:
        return
    if planned_s > 0 and round_s > 0 and shape.prompt_tokens == 0:
        # the kind `round_s` priced it as: drafts planned (a call asked for them, or made ahead);
        # a round that read prompts calibrates the prompts' price, not its kind's (module docstring)
        kind = "drafting" if shape.steps > 0 or shape.drafted > 0 else "plain"
        add(f"{CALIBRATION}:{kind}:planned", planned_s)
        add(f"{CALIBRATION}:{kind}:measured", round_s)
    add_point(add, VERIFY, shape.verify_features(), verify_s)
    _add_edge(add, VERIFY, shape.rows + shape.drafted)
    if shape.draft_rows > 0 and shape.steps > 0:
        add_point(add, DRAFT, shape.draft_features(), draft_s)
        _add_edge(add, DRAFT, shape.draft_rows * shape.steps)
    add("cost_rounds", 1.0)
    add("overhead_seconds", max(0.0, round_s - verify_s - draft_s))
    if shape.prompts > 0:
        add(f"{PREFILL}:rows", float(shape.prompts))
        add(f"{PREFILL}:tokens", float(shape.prompt_tokens))
