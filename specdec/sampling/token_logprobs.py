"""The log-probabilities of emitted tokens, as OpenAI's `logprobs` reports them.

Every token a round emits (accepted, recovered or bonus) sits at a position whose target
distribution the verifier already computed: the logits at that position of the round's
one target forward. A token's logprob is the log of the probability the target assigns it
there after the request's processing - logit_bias and penalties over the tokens before it
(`specdec.sampling.logits_processors`), then temperature, top-k, top-p and min_p
(`specdec.sampling.sampling.logits_to_probs`), the distribution the output follows - so it is
the same whatever was drafted: with speculation on or off, the emitted token at a position
and the target's logits there are the same (up to float32 rounding: a forward that scores
more positions at once may round the logits differently, by about 1e-6 in a logprob).
A greedy request (temperature 0) reports the distribution at temperature 1 with the rest of
its processing (as vLLM does; its processed distribution is one-hot). Tokens that processing removes
have logprob -inf.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from specdec.sampling.sampling import SamplingBatch, logits_to_probs
from specdec.sampling.sampling_params import SamplingParams

MAX_TOP_LOGPROBS = 20  # the most alternatives a request may ask for (OpenAI's limit)


@dataclass(frozen=True)
class TokenLogprob:
    """One emitted token: its logprob and the `top` most likely tokens at its position
    ((token id, logprob), most likely first; as many as the request asked for)."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


def reported_params(params: SamplingParams) -> SamplingParams:
    """The processing whose distribution is reported: the request's, at temperature 1 when greedy."""
    # a seed of its own: building the batch draws no random seed (nothing is drawn from it)
    return dataclasses.replace(params, temperature=params.temperature or 1.0, seed=0)


def emitted_logprobs(logits: Tensor, params: SamplingParams, emitted: list[int], top: int,
                     history: Sequence[int] = (), num_prompt_tokens: int = 0,
                     token_mask: Tensor | None = None) -> list[TokenLogprob]:
    """The logprobs of one row's emitted tokens.

    logits: [T, V] the target's logits at the row's positions (position j predicts
        emitted[j]; T >= len(emitted)).
    params: the request's sampling; top: how many alternatives per token (0..MAX_TOP_LOGPROBS).
    history / num_prompt_tokens: the tokens the first position sees and how many of them
        are the prompt (what penalties and logit_bias read; position j also sees emitted[:j]).
    token_mask: the row's grammar masks, [>= T, W] packed (position j's tokens allowed), or None:
        the reported distribution is the masked one the output follows.
    """
    n = len(emitted)
    batch = SamplingBatch.from_params([reported_params(params)], histories=[list(history)],
                                      num_prompt_tokens=[num_prompt_tokens])
    if token_mask is not None:
        batch.token_masks = token_mask[None, :n]  # [1, n, W]
    before = torch.tensor([emitted[: n - 1]], dtype=torch.long, device=logits.device)  # [1, n - 1]
    processed = batch.processed(logits[None, :n], before)  # [1, n, V]
    return _reported(logits_to_probs(processed, batch)[0].log(), emitted, top)  # [n, V] float64


def prompt_logprobs(logits: Tensor, tokens: Sequence[int], top: int) -> list[TokenLogprob]:
    """The logprobs of prompt tokens under the target's raw distribution (log_softmax of its
    logits; no request processing, as vLLM and OpenAI's echo report a prompt).

    logits: [n, V] the target's logits at the positions before `tokens` (row j predicts
        tokens[j]); top: how many alternatives per token (0..MAX_TOP_LOGPROBS).
    """
    return _reported(torch.log_softmax(logits[: len(tokens)].double(), dim=-1), list(tokens), top)  # [n, V]


def _reported(logprobs: Tensor, tokens: list[int], top: int) -> list[TokenLogprob]:
    """Each token's logprob and the `top` most likely tokens at its position.
    logprobs: [n, V] float64, row j the distribution tokens[j] was drawn from."""
    index = torch.tensor(tokens, dtype=torch.long, device=logprobs.device)[:, None]  # [n, 1]
    chosen = logprobs.gather(-1, index)[:, 0].tolist()
    if top > 0:
        best = logprobs.topk(min(top, logprobs.shape[-1]), dim=-1)  # values, indices [n, top]
        alternatives = [tuple(zip(ids, values)) for ids, values in zip(best.indices.tolist(), best.values.tolist())]
    else:
        alternatives = [()] * len(tokens)
    return [TokenLogprob(token, value, alts) for token, value, alts in zip(tokens, chosen, alternatives)]
