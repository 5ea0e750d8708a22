"""End to end: speculation with the real draft model and target verifier is lossless.

Many independent sequences (distinct seq_ids and seeds, the same short prompt) run
speculative rounds through the real `DraftModelProposer` - sampling its guesses from q
rounded to float16, as it does when q travels over gRPC - and the real `TargetVerifier`
(target forward + rejection sampling) on the bundled model pair. The tokens they generate
must follow the target model's own processed distribution, computed here from the
target's logits with an independent numpy reference of temperature / top-k / top-p:

* the first generated token follows p(x1 | prompt) (T = 1.0, and T = 0.8 with top-p 0.9);
* in one round mixing greedy and sampled rows, draft-model q and n-gram drafts without q,
  and gamma 0 to 3 per row, every row's first token follows its own p (greedy: argmax);
* two consecutive tokens, the second often decided in the next round, follow
  p(x1) p(x2 | x1) (top-k 8 keeps the joint table small).

And the checks have teeth: the draft's own guesses, and tokens drawn from a wrongly
processed p, fail them at the same sample size. Chi-squared tests with fixed
seeds (deterministic), family-wise ALPHA per test. Sample sizes are what a 2-core CPU
runs in ~15 s per test: a real target forward costs ~1-2 ms per row and token there.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from specdec.sampling.counter_rng import ROLE_FINAL, as_seeds, uniforms
from specdec.models.model_paths import resolve_model_path
from specdec.models.model_runner import ModelRunner
from specdec.proposers.base import ProposalRequest
from specdec.proposers.draft_proposer import DraftModelProposer
from specdec.sampling.sampling_params import SamplingParams
from specdec.verifiers.target_verifier import TargetVerifier
from specdec.verifiers.verifier import VerifyRequest
from token_statistics import ALPHA, as_table, p_value, reference_probs

pytestmark = [pytest.mark.statistical, pytest.mark.slow]

PROMPT = [481]  # "def" in the bundled tokenizer: a spread-out next-token distribution
BATCH = 1024  # rows per proposer / verifier call
MAX_SEQ_LEN = 8


# --- independent reference and goodness of fit ------------------------------------------


# --- the real system ---------------------------------------------------------------------


@dataclass(frozen=True)
class Models:
    target: torch.nn.Module
    draft: torch.nn.Module
    vocab_size: int


@functools.lru_cache(maxsize=1)
def models() -> Models:
    target = ModelRunner.from_pretrained(resolve_model_path("bundled:target"), num_slots=1, max_seq_len=MAX_SEQ_LEN)
    draft = ModelRunner.from_pretrained(resolve_model_path("bundled:draft"), num_slots=1, max_seq_len=MAX_SEQ_LEN)
    return Models(target.model, draft.model, target.vocab_size)


def target_logits(histories: list[list[int]]) -> np.ndarray:
    """The target model's next-token logits after each history, [n, V] float64."""
    runner = ModelRunner(models().target, num_slots=len(histories), max_seq_len=MAX_SEQ_LEN)
    slots = [runner.allocate_slot() for _ in histories]
    return runner.forward(slots, histories, last_only=True).double().numpy()


@dataclass
class Generated:
    tokens: list[list[int]]  # per row, the tokens generated after the prompt
    first_drafts: np.ndarray  # [rows] the draft model's first guess of every row
    first_round_emitted: np.ndarray  # [rows] how many tokens the first round emitted


def speculate(params: list[SamplingParams], gamma: int, min_tokens: int) -> Generated:
    """Run speculative rounds (draft proposes gamma tokens, target verifies) for one
    sequence per params entry, all starting from PROMPT, until each has generated at least
    min_tokens tokens. Rows run BATCH at a time on fresh model runners."""
    tokens: list[list[int]] = []
    first_drafts, first_round_emitted = [], []
    for start in range(0, len(params), BATCH):
        chunk = params[start : start + BATCH]
        draft_runner = ModelRunner(models().draft, num_slots=len(chunk), max_seq_len=MAX_SEQ_LEN)
        proposer = DraftModelProposer(draft_runner, models().vocab_size, wire_dtype=torch.float16)
        verifier = TargetVerifier(ModelRunner(models().target, num_slots=len(chunk), max_seq_len=MAX_SEQ_LEN))
        histories = [list(PROMPT) for _ in chunk]
        for round_index in itertools.count():
            pending = [i for i, h in enumerate(histories) if len(h) - len(PROMPT) < min_tokens]
            if not pending:
                break
            requests = [ProposalRequest(f"seq-{start + i}", histories[i], chunk[i], gamma=gamma) for i in pending]
            proposal = proposer.propose(requests)
            verify = []
            for r, drafts in zip(requests, proposal):
                # q: float16-rounded weights, as over gRPC
                verify.append(VerifyRequest(r.seq_id, r.token_ids, drafts.token_ids, r.sampling, drafts.q))
            for i, result in zip(pending, verifier.verify(verify)):
                histories[i].extend(result.emitted)
            if round_index == 0:
                first_drafts.append(np.array([drafts.token_ids[0] for drafts in proposal]))
                first_round_emitted.append(np.array([len(h) - len(PROMPT) for h in histories]))
        tokens.extend(h[len(PROMPT) :] for h in histories)
    return Generated(tokens, np.concatenate(first_drafts), np.concatenate(first_round_emitted))


def rows_of(params: SamplingParams, n: int, first_seed: int) -> list[SamplingParams]:
    return [dataclasses.replace(params, seed=first_seed + i) for i in range(n)]


# --- the first generated token -----------------------------------------------------------

FIRST_TOKEN_CASES = {  # name: (params, gamma, rows, first seed)
    "T 1.0, gamma 2": (SamplingParams(temperature=1.0), 2, 4096, 1_000_000),
    "T 0.8 top-p 0.9, gamma 3": (SamplingParams(temperature=0.8, top_p=0.9), 3, 3072, 2_000_000),
}


@functools.lru_cache(maxsize=1)
def prompt_logits() -> np.ndarray:
    """The target's logits for the first generated token, [V]."""
    return target_logits([PROMPT])[0]


@functools.lru_cache(maxsize=None)
def first_token_run(name: str) -> Generated:
    params, gamma, rows, first_seed = FIRST_TOKEN_CASES[name]
    return speculate(rows_of(params, rows, first_seed), gamma, min_tokens=1)


@pytest.mark.parametrize("name", FIRST_TOKEN_CASES)
def test_the_first_generated_token_follows_the_targets_processed_distribution(name):
    generated = first_token_run(name)
    p = reference_probs(prompt_logits(), FIRST_TOKEN_CASES[name][0])
    first = np.array([t[0] for t in generated.tokens])
    pv = p_value(first, as_table(p))
    assert pv > ALPHA / 2, f"{name}: chi-squared p-value {pv:.2e} over {len(first)} rows"
    # the test can fail at this sample size: the draft's own guesses do not pass as p
    assert p_value(generated.first_drafts, as_table(p)) < ALPHA / 2


def _wrongly_processed(logits: np.ndarray, mistake: str) -> np.ndarray:
    """p for T 0.8, top-p 0.9 with a deliberate mistake."""
    if mistake == "top-p ignored":
        return reference_probs(logits, SamplingParams(temperature=0.8))
    assert mistake == "temperature only in the top-p set"  # same support, T = 1 probabilities
    support = reference_probs(logits, SamplingParams(temperature=0.8, top_p=0.9)) > 0
    return np.where(support, reference_probs(logits, SamplingParams(temperature=1.0)), 0.0)


@pytest.mark.parametrize("mistake", ["top-p ignored", "temperature only in the top-p set"])
def test_the_check_catches_wrong_processing_at_the_same_sample_size(mistake):
    """Tokens drawn (with the same addressed uniforms) from a wrongly processed p fail.
    (A top-p that drops just the crossing token would pass: here that token carries 1.5e-4
    of the mass. test_rejection_sampler_statistics catches that one on a small vocabulary.)"""
    params, _, rows, first_seed = FIRST_TOKEN_CASES["T 0.8 top-p 0.9, gamma 3"]
    p, wrong = reference_probs(prompt_logits(), params), _wrongly_processed(prompt_logits(), mistake)
    seeds = as_seeds(np.arange(first_seed, first_seed + rows, dtype=np.uint64))
    u = uniforms(seeds, np.full(rows, len(PROMPT)), ROLE_FINAL)
    tokens = np.searchsorted(np.cumsum(wrong), u * wrong.sum(), side="right")
    assert p_value(tokens, as_table(p)) < ALPHA


# --- a mixed batch ------------------------------------------------------------------------

MIXED_KINDS = {  # name: (params, gamma, n-gram drafts verified with draft_probs=None, or None)
    "T 1.0 top-k 8, model q, gamma 3": (SamplingParams(temperature=1.0, top_k=8), 3, None),
    "T 0.7 top-k 8, n-gram q, 2 drafts": (SamplingParams(temperature=0.7, top_k=8), 2, "argmax"),
    "greedy, model q, gamma 2": (SamplingParams(temperature=0.0), 2, None),
    "T 1.3 top-k 8, gamma 0": (SamplingParams(temperature=1.3, top_k=8), 0, None),
    "T 1.0 top-k 8 top-p 0.8, model q, gamma 1": (SamplingParams(temperature=1.0, top_k=8, top_p=0.8), 1, None),
}


def test_every_row_of_a_mixed_round_follows_its_own_target():
    """One round, all kinds of rows interleaved in the same proposer and verifier calls:
    greedy and sampled rows, the draft model's q and n-gram drafts without q, per-row gamma
    from 0 to 3. Each row's first token follows its own processed p (greedy: the argmax)."""
    per_kind, kinds = 512, list(MIXED_KINDS.values())
    rows = per_kind * len(kinds)
    argmax = int(prompt_logits().argmax())
    draft_runner = ModelRunner(models().draft, num_slots=rows, max_seq_len=MAX_SEQ_LEN)
    proposer = DraftModelProposer(draft_runner, models().vocab_size, wire_dtype=torch.float16)
    verifier = TargetVerifier(ModelRunner(models().target, num_slots=rows, max_seq_len=MAX_SEQ_LEN))
    kind_of = [r % len(kinds) for r in range(rows)]
    params = [dataclasses.replace(kinds[k][0], seed=7_000_000 + r) for r, k in enumerate(kind_of)]
    drafted = [r for r in range(rows) if kinds[kind_of[r]][2] is None]
    proposal = proposer.propose(
        [ProposalRequest(f"mixed-{r}", list(PROMPT), params[r], gamma=kinds[kind_of[r]][1]) for r in drafted]
    )
    requests = [VerifyRequest(f"mixed-{r}", list(PROMPT), [argmax, 13], params[r], None) for r in range(rows)]
    for r, drafts in zip(drafted, proposal):
        assert len(drafts) == kinds[kind_of[r]][1]
        requests[r].draft_token_ids, requests[r].draft_probs = drafts.token_ids, drafts.q
    first = np.array([result.emitted[0] for result in verifier.verify(requests)])
    assert verifier.rejected_proposals == 0
    for k, (name, (kind_params, _, _)) in enumerate(MIXED_KINDS.items()):
        mine = first[np.array(kind_of) == k]
        if kind_params.is_greedy:
            assert (mine == argmax).all(), name
            continue
        pv = p_value(mine, as_table(reference_probs(prompt_logits(), kind_params)))
        assert pv > ALPHA / (len(kinds) - 1), f"{name}: chi-squared p-value {pv:.2e}"


# --- two consecutive tokens across a round boundary --------------------------------------


def test_two_consecutive_tokens_follow_the_targets_joint_distribution():
    """gamma = 1: a round emits x1 alone when the guess is rejected (x2 then comes from the
    next round, with new draws at position + 1) or x1 and a bonus x2. Both ways, (x1, x2)
    must follow p(x1) p(x2 | x1) of the target, with the same top-k 8 at both positions."""
    params = SamplingParams(temperature=1.0, top_k=8)
    vocab = models().vocab_size
    p1 = reference_probs(prompt_logits(), params)
    support = np.flatnonzero(p1)
    second = target_logits([PROMPT + [int(x1)] for x1 in support])  # [8, V]
    joint = {
        int(x1) * vocab + int(x2): p1[x1] * p2
        for x1, logits in zip(support, second)
        for x2, p2 in as_table(reference_probs(logits, params)).items()
    }
    generated = speculate(rows_of(params, 4096, first_seed=5_000_000), gamma=1, min_tokens=2)
    pairs = np.array([t[0] * vocab + t[1] for t in generated.tokens])
    crossed = float((generated.first_round_emitted == 1).mean())  # x2 decided in round 2
    assert 0.2 < crossed < 0.8, f"both ways of emitting x2 must be common ({crossed:.0%} crossed)"
    pv = p_value(pairs, joint)
    assert pv > ALPHA, f"joint chi-squared p-value {pv:.2e} over {len(pairs)} rows"
    # the test can fail: pairing x1 with the second token of another row breaks the dependence
    shuffled = np.array([t[0] for t in generated.tokens]) * vocab + np.roll([t[1] for t in generated.tokens], 1)
    assert p_value(shuffled, joint) < ALPHA
