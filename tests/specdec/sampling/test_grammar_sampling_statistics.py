"""Constrained sampling under speculation is exact: emitted tokens follow the target's
distribution masked by the grammar, whatever the draft proposed (masked by the grammar or not).

Setting: a small vocabulary, fixed target logits and draft distributions per position (a
draft that knows nothing of the grammar, so it often drafts forbidden tokens; or one that
draws from its q masked by the grammar after its drafts before, as `DraftModelProposer` does
under a grammar, and reports that q), and a grammar whose
allowed set depends on the previous token (`ParityGrammar`). Every round runs the real path:
`GrammarRow.constrain` cuts the draft after its first forbidden token and writes the masks,
`rejection_sample` verifies against the masked p. The first emitted token must follow masked
p_1; the second, given the first, masked p_2 under the mask the first one leaves. Chi-squared
goodness-of-fit over 60k rounds with fixed seeds, family-wise ALPHA (Bonferroni).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from specdec.sampling.grammar_mask import batch_masks
from specdec.sampling.grammar_matcher import GrammarMatcher
from specdec.sampling.grammar_row import GrammarRow
from specdec.sampling.rejection_sampler import rejection_sample
from specdec.sampling.sampling import SamplingBatch
from specdec.sampling.sampling_params import SamplingParams
from sampling_rules import standard_rule

pytestmark = [pytest.mark.statistical, pytest.mark.slow]

ROUNDS = 60_000
VOCAB = 8
GAMMA = 3
ALPHA = 1e-4


class ParityGrammar(GrammarMatcher):
    """After an even token (or at the start) only odd tokens may follow, and 0; after an odd one, any."""

    def __init__(self) -> None:
        self.tokens: list[int] = []

    def allowed(self) -> list[int]:
        if self.tokens and self.tokens[-1] % 2:
            return list(range(VOCAB))
        return [0] + [t for t in range(VOCAB) if t % 2]

    def fill_mask(self, out: np.ndarray) -> None:
        out[:] = 0
        out[0] = sum(1 << t for t in self.allowed())

    def accept(self, token: int) -> bool:
        if token not in self.allowed():
            return False
        self.tokens.append(token)
        return True

    def rollback(self, num_tokens: int) -> None:
        del self.tokens[len(self.tokens) - num_tokens:]

    def fork(self) -> ParityGrammar:
        copy = ParityGrammar()
        copy.tokens = list(self.tokens)
        return copy

    @property
    def ended(self) -> bool:
        return False


def masked(p: np.ndarray, allowed: list[int]) -> np.ndarray:
    out = np.zeros_like(p)
    out[allowed] = p[allowed]
    return out / out.sum()


def masked_drafts(rng: np.random.Generator, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Drafts [ROUNDS, GAMMA] drawn as a grammar-masked draft does (each position from q masked by
    the grammar after the drafts before it, renormalised), and those masked q [ROUNDS, GAMMA, V]."""
    drafts, qs = np.zeros((ROUNDS, GAMMA), dtype=np.int64), np.zeros((ROUNDS, GAMMA, VOCAB))
    start = ParityGrammar().allowed()
    for k in range(GAMMA):
        free = drafts[:, k - 1] % 2 == 1 if k else np.zeros(ROUNDS, dtype=bool)  # after an odd token: any
        qs[:, k] = np.where(free[:, None], q[k], masked(q[k], start))
        drafts[:, k] = np.where(free, rng.choice(VOCAB, size=ROUNDS, p=q[k]),
                                rng.choice(VOCAB, size=ROUNDS, p=masked(q[k], start)))
    return drafts, qs


def run_rounds(rng: np.random.Generator, masked_draft: bool = False):
    """(target p [GAMMA + 1, V], emitted tokens [ROUNDS, GAMMA + 1], num_accepted [ROUNDS], kept
    drafts [ROUNDS]) of ROUNDS independent rounds from an empty history; the draft knows the
    grammar (masked_draft) or not."""
    logits = torch.from_numpy(rng.normal(size=(GAMMA + 1, VOCAB)))  # [GAMMA + 1, V]
    q = rng.dirichlet(np.ones(VOCAB), size=GAMMA)  # [GAMMA, V]: the draft's own distributions
    if masked_draft:
        drafts, qs = masked_drafts(rng, q)
    else:
        drafts = np.stack([rng.choice(VOCAB, size=ROUNDS, p=q[k]) for k in range(GAMMA)], axis=1)  # [ROUNDS, GAMMA]
        qs = np.broadcast_to(q, (ROUNDS, GAMMA, VOCAB))
    kept, masks = [], []
    for draft in drafts.tolist():
        n, mask = GrammarRow(ParityGrammar(), VOCAB).constrain(draft)
        kept.append(n)
        masks.append(mask)
    params = [SamplingParams(temperature=1.0, seed=i) for i in range(ROUNDS)]
    batch = standard_rule(SamplingBatch.from_params(params))
    batch.token_masks = batch_masks(masks, GAMMA + 1, VOCAB)
    out = rejection_sample(logits.expand(ROUNDS, -1, -1).clone(), torch.from_numpy(drafts), torch.tensor(kept),
                           torch.from_numpy(np.ascontiguousarray(qs)), batch)
    p = torch.softmax(logits, dim=-1).numpy()
    return p, out.output_token_ids, out.num_accepted, torch.tensor(kept)


def fits(observed: np.ndarray, expected_probs: np.ndarray) -> float:
    """The chi-squared p-value of counts against a distribution (over its support)."""
    support = expected_probs > 0
    assert observed[~support].sum() == 0, "a token the grammar forbids was emitted"
    return stats.chisquare(observed[support], expected_probs[support] * observed.sum()).pvalue


@pytest.mark.parametrize("masked_draft", [False, True], ids=["unconstrained draft", "grammar-masked draft"])
def test_emitted_tokens_follow_the_masked_target_distribution_whether_the_draft_knows_the_grammar_or_not(
        masked_draft):
    p, tokens, num_accepted, kept = run_rounds(np.random.default_rng(7), masked_draft)
    if masked_draft:
        assert bool((kept == GAMMA).all()), "a masked draft proposes only tokens the grammar allows"
    else:
        assert bool((kept < GAMMA).any()), "some drafts were cut (the draft ignores the grammar)"
    first = tokens[:, 0].numpy()
    start = ParityGrammar().allowed()
    checks = [fits(np.bincount(first, minlength=VOCAB), masked(p[0], start))]
    reached = (num_accepted >= 1).numpy()  # rounds whose second emitted token came from position 2
    for prev in start:
        rows = reached & (first == prev)
        follower = ParityGrammar()
        follower.tokens = [prev]
        if rows.sum() >= 200:
            checks.append(fits(np.bincount(tokens[rows, 1].numpy(), minlength=VOCAB), masked(p[1], follower.allowed())))
    assert len(checks) >= 3
    assert min(checks) > ALPHA / len(checks), f"p-values {checks}"
