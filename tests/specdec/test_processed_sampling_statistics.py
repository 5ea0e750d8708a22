"""Speculation is exact w.r.t. the *processed* target distribution: penalties, logit_bias
and min_p, each drafted position processed over the tokens before it.

Setting: a row's history (prompt + output) and fixed raw logits per position, for the
target (gamma + 1 positions) and the draft (gamma). The draft processes its own logits
the same way - position 2 seeing its own first guess - and drafts from that q. Each batch
row is one independent round (its own seed). Conditioned on the round reaching position k
with drafts d_1 .. d_{k-1} accepted, the token emitted there must follow
p_k = processed(target_k | history + d_1 .. d_{k-1}): the test groups the rounds by that
prefix and checks every group with enough samples (chi-squared, Bonferroni over the groups).

The expected p comes from `processed_reference`, a numpy implementation written from the
definitions (OpenAI penalties, transformers' repetition penalty and min_p), independent
of specdec.sampling.logits_processors and specdec.sampling.sampling.
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
import torch

from sampling_rules import standard_rule
from specdec.sampling.rejection_sampler import rejection_sample
from specdec.sampling.sampling import SamplingBatch
from specdec.sampling.sampling_params import SamplingParams
from token_statistics import as_table, p_value

pytestmark = pytest.mark.statistical

ROUNDS = 60_000
VOCAB = 6
GAMMA = 2
ALPHA = 1e-4
MIN_GROUP = 2_000  # a prefix group checked needs this many rounds
HISTORY, NUM_PROMPT = [0, 5, 2, 2, 3], 2  # prompt [0, 5]; output [2, 2, 3]
PARAMS = SamplingParams(temperature=1.1, min_p=0.05, repetition_penalty=1.4, frequency_penalty=0.6,
                        presence_penalty=0.5, logit_bias={1: 0.5, 4: -1.0})


def processed_reference(logits: np.ndarray, params: SamplingParams, history: list[int]) -> np.ndarray:
    """p from the definitions: bias; repetition penalty over every earlier token; frequency
    and presence penalties over the output; softmax(/ T); min_p relative to the top token."""
    x = np.asarray(logits, dtype=np.float64).copy()
    for token, bias in params.logit_bias:
        x[token] += bias
    for token in set(history):
        x[token] = x[token] / params.repetition_penalty if x[token] > 0 else x[token] * params.repetition_penalty
    output = history[NUM_PROMPT:]
    for token in set(output):
        x[token] -= params.frequency_penalty * output.count(token) + params.presence_penalty
    probs = np.exp((x - x.max()) / params.temperature)
    probs /= probs.sum()
    ratio = probs / probs.max()
    assert np.abs(ratio - params.min_p).min() > 1e-6, "a token sits on the min_p cut-off: ambiguous"
    probs = np.where(ratio >= params.min_p, probs, 0.0)
    return probs / probs.sum()


def _setting(seed: int):
    """Raw target logits [gamma + 1, V], raw draft logits [gamma, V] (a perturbed target)."""
    rng = np.random.default_rng(seed)
    target = 0.7 * rng.standard_normal((GAMMA + 1, VOCAB))
    return target, target[:GAMMA] + 0.5 * rng.standard_normal((GAMMA, VOCAB)), rng


def _drafts(draft: np.ndarray, rng: np.random.Generator, batch: SamplingBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """Drafted ids [ROUNDS, 2] and the q each was drawn from [ROUNDS, 2, V]: the draft's
    second guess is drawn from its logits processed over the history and its first guess.
    Coupled rows draw as the draft does for them: Gumbel-max under the target's noise."""
    q1 = processed_reference(draft[0], PARAMS, HISTORY)
    q2 = np.stack([processed_reference(draft[1], PARAMS, HISTORY + [d]) for d in range(VOCAB)])  # [V, V]
    if bool(batch.coupled.all()):
        d1 = batch.gumbel_tokens(torch.from_numpy(q1).expand(ROUNDS, -1), torch.zeros(ROUNDS, dtype=torch.long)).numpy()
        d2 = batch.gumbel_tokens(torch.from_numpy(q2[d1]), torch.ones(ROUNDS, dtype=torch.long)).numpy()
    else:
        d1 = rng.choice(VOCAB, size=ROUNDS, p=q1)
        cdf = np.cumsum(q2[d1], axis=-1)
        d2 = np.minimum((cdf < rng.random((ROUNDS, 1)) * cdf[:, -1:]).sum(-1), VOCAB - 1)
    q = np.stack([np.broadcast_to(q1, (ROUNDS, VOCAB)), q2[d1]], axis=1)
    return torch.from_numpy(np.stack([d1, d2], axis=1)), torch.from_numpy(q)


def _batch(coupled: bool, first_seed: int) -> SamplingBatch:
    params = [dataclasses.replace(PARAMS, seed=first_seed + i) for i in range(ROUNDS)]
    batch = SamplingBatch.from_params(params, [len(HISTORY)] * ROUNDS, histories=[HISTORY] * ROUNDS,
                                      num_prompt_tokens=[NUM_PROMPT] * ROUNDS)
    return batch if coupled else standard_rule(batch)


def _failing_groups(target: np.ndarray, ids: torch.Tensor, out) -> list[str]:
    """Every prefix group (with enough rounds) whose emitted tokens do not follow its p."""
    tokens, accepted = out.output_token_ids, out.num_accepted
    groups = [(k, prefix) for k in range(GAMMA + 1) for prefix in itertools.product(range(VOCAB), repeat=k)]
    checked, failing = [], []
    for k, prefix in groups:
        reached = accepted >= k
        for j, token in enumerate(prefix):
            reached &= ids[:, j] == token
        if int(reached.sum()) >= MIN_GROUP:
            checked.append((k, prefix, tokens[reached, k].numpy()))
    assert len(checked) >= 6, f"only {len(checked)} groups with {MIN_GROUP} rounds"
    for k, prefix, emitted in checked:
        p = processed_reference(target[k], PARAMS, HISTORY + list(prefix))
        value = p_value(emitted, as_table(p))
        if value <= ALPHA / len(checked):
            failing.append(f"position {k + 1} after drafts {prefix}: p-value {value:.2e} (n={len(emitted)})")
    return failing


@pytest.mark.parametrize("coupled", [False, True], ids=["standard rule", "coupled rule"])
def test_emitted_tokens_follow_the_processed_target_at_every_position(coupled):
    target, draft, rng = _setting(seed=31 + coupled)
    batch = _batch(coupled, first_seed=ROUNDS * (7 + coupled))
    ids, q = _drafts(draft, rng, batch)
    out = rejection_sample(torch.from_numpy(target).expand(ROUNDS, -1, -1), ids, torch.full((ROUNDS,), GAMMA), q, batch)
    assert _failing_groups(target, ids, out) == []
    assert 0 < float(out.num_accepted.float().mean()) < GAMMA  # both verdicts occur


def test_the_check_catches_positions_processed_without_the_drafts_before_them():
    """A verifier that processes every position over the history alone (blind to the drafts
    before it) emits tokens off the processed target: the check must say so."""
    target, draft, rng = _setting(seed=33)
    blind = np.stack([np.log(processed_reference(target[k], PARAMS, HISTORY) + 1e-300) for k in range(GAMMA + 1)])
    batch = dataclasses.replace(_batch(False, first_seed=0), processing=None)
    ids, q = _drafts(draft, rng, batch)
    plain = dataclasses.replace(batch, min_p=torch.zeros(ROUNDS, dtype=torch.float64),
                                temperature=torch.ones(ROUNDS, dtype=torch.float64))
    out = rejection_sample(torch.from_numpy(blind).expand(ROUNDS, -1, -1), ids, torch.full((ROUNDS,), GAMMA), q, plain)
    assert _failing_groups(target, ids, out) != []
