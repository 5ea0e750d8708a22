"""Batched verification of drafted tokens (Leviathan et al., 2023), lossless.

For each row b and each position i < num_drafted[b], the drafted token x_i is accepted
with probability min(1, p_i(x_i) / q_i(x_i)), where p = logits_to_probs(target_logits) and
q is the processed draft distribution. At the first rejection the round emits a
*recovered* token drawn from norm(max(0, p_i - q_i)) and stops; when every drafted token
is accepted it emits a *bonus* token drawn from p at position num_drafted[b]. Either way
each round emits its accepted tokens plus exactly one recovered-or-bonus token, and the
emitted tokens follow the processed target distribution exactly.

Processing that depends on the tokens so far (a request's penalties and logit_bias,
`SamplingBatch.processing`) is applied to the target's logits first, position i seeing the
history and the drafted tokens d_1 .. d_i before it: p_i is then exactly the distribution
plain decoding would draw that token from, had d_1 .. d_i been emitted - which is the
only case in which position i's verdict is used. Greedy rows take the processed argmax.

Greedy rows (temperature 0) take a fast path with no randomness: accept while the drafted
token equals the target's argmax, then emit the argmax. A proposer without probabilities
(n-gram) passes draft_probs=None and is verified as a one-hot q.

Coupled rows (a sampled request with a seed of its own, `SamplingBatch.coupled`) use the
drafter-invariant rule instead (Daliri, Musco and Suresh, 2024): the target's token at
each position is its Gumbel-max token under noise addressed by (seed, position, token)
(`specdec.sampling.gumbel_sampling`), the draft drew its guess with the same noise, and a drafted
token is accepted iff it equals the target's token there; the recovered or bonus token is
the target's token at the first position not accepted. Every emitted token is then a
function of p and (seed, position) alone - the same whatever was drafted, or if nothing
was - and follows p exactly (the Gumbel-max trick). q is not needed.

Randomness: row b's positions start at sampling.positions[b] (the history position of
its first drafted token). The acceptance test of the drafted token at position t uses the
uniform (seed, t, ROLE_ACCEPT) and the recovered-or-bonus token at position t uses
(seed, t, ROLE_FINAL) (specdec.sampling.counter_rng), so a row's output depends only on its own
seed, history and proposals, never on the rest of the batch. All arithmetic is float64.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from specdec.sampling.counter_rng import ROLE_ACCEPT, ROLE_FINAL
from specdec.sampling.sampling import SamplingBatch, inverse_cdf_sample, logits_to_probs, normalize_probs, row_index

PAD_TOKEN_ID = -1


@dataclass
class RejectionOutput:
    """The result of one round of verification for a batch.

    output_token_ids: [B, gamma + 1] int64: the accepted tokens, then one recovered-or-bonus
        token, then PAD_TOKEN_ID (-1) padding.
    num_accepted: [B] int64: accepted drafted tokens per row (emitted = num_accepted + 1).
    """

    output_token_ids: Tensor
    num_accepted: Tensor

    def emitted(self) -> list[list[int]]:
        """Per row, the emitted (non-padding) tokens."""
        rows = self.output_token_ids.tolist()
        counts = (self.num_accepted + 1).tolist()
        return [row[:n] for row, n in zip(rows, counts)]


def rejection_sample(
    target_logits: Tensor,
    draft_token_ids: Tensor,
    num_drafted: Tensor,
    draft_probs: Tensor | None,
    sampling: SamplingBatch,
) -> RejectionOutput:
    """Verify one round of drafted tokens for every row of the batch.

    target_logits: [B, gamma + 1, V] raw target logits at the positions of
        [pending, d_1 .. d_gamma] (position i predicts the token after d_i).
    draft_token_ids: [B, gamma] int64; entries past num_drafted[b] are ignored.
    num_drafted: [B] int64, each in [0, gamma].
    draft_probs: [B, gamma, V] processed draft distribution q (same SamplingParams as the
        target) as non-negative weights, normalised here in float64, or None for a proposer
        without probabilities (verified as one-hot q).
    sampling: the batch's SamplingBatch (B rows); its processing, when any, is applied
        here (position i sees the row's history + its drafts before i).
    """
    _check_inputs(target_logits, draft_token_ids, num_drafted, draft_probs, sampling)
    batch, gamma_plus_one, _ = target_logits.shape
    device = target_logits.device
    num_drafted = num_drafted.to(device=device, dtype=torch.int64)
    drafted = torch.arange(gamma_plus_one - 1, device=device) < num_drafted[:, None]  # [B, gamma]
    draft_ids = torch.where(drafted, draft_token_ids.to(device=device, dtype=torch.int64), 0)  # [B, gamma]
    target_logits = sampling.processed(target_logits, draft_ids)  # [B, gamma + 1, V]
    out_tokens = torch.full((batch, gamma_plus_one), PAD_TOKEN_ID, dtype=torch.int64, device=device)
    num_accepted = torch.zeros(batch, dtype=torch.int64, device=device)

    greedy = sampling.greedy.to(device)  # [B]
    coupled = sampling.coupled.to(device)  # [B]
    if bool(greedy.any()):
        rows = row_index(greedy)
        out_tokens[rows], num_accepted[rows] = _verify_greedy(target_logits[rows], draft_ids[rows], drafted[rows])
    if bool(coupled.any()):
        rows = row_index(coupled)
        out_tokens[rows], num_accepted[rows] = _verify_coupled(
            target_logits[rows], draft_ids[rows], drafted[rows], sampling.select(rows)
        )
    standard = ~greedy & ~coupled  # [B]
    if bool(standard.any()):
        rows = row_index(standard)
        out_tokens[rows], num_accepted[rows] = _verify_sampled(
            target_logits[rows],
            draft_ids[rows],
            num_drafted[rows],
            None if draft_probs is None else draft_probs.to(device)[rows],
            sampling.select(rows),
        )
    return RejectionOutput(output_token_ids=out_tokens, num_accepted=num_accepted)


def greedy_verdicts(target_logits: Tensor, drafts: list[list[int]]) -> tuple[list[list[int]], list[int]]:
    """rejection_sample's greedy rule for a batch of greedy rows without processing or
    grammar masks, on lists: accept while the drafted token equals the target's argmax,
    then emit the argmax (the same verdicts, in one tensor op and one read instead of the
    batched path's dozens of small tensor ops, each of which costs host time every round).

    target_logits: [B, gamma + 1, V] (row b's positions past len(drafts[b]) are ignored).
    Returns (emitted tokens per row, num_accepted per row)."""
    choices = target_logits.argmax(dim=-1).tolist()  # [B, gamma + 1]
    emitted, accepted = [], []
    for choice, drafted in zip(choices, drafts, strict=True):
        n = 0
        while n < len(drafted) and drafted[n] == choice[n]:
            n += 1
        emitted.append([*drafted[:n], choice[n]])
        accepted.append(n)
    return emitted, accepted


def _check_inputs(
    target_logits: Tensor,
    draft_token_ids: Tensor,
    num_drafted: Tensor,
    draft_probs: Tensor | None,
    sampling: SamplingBatch,
) -> None:
    """Assert the shapes (and index ranges) rejection_sample relies on."""
    assert target_logits.dim() == 3, f"target_logits must be [B, gamma + 1, V], got {tuple(target_logits.shape)}"
    batch, gamma_plus_one, vocab = target_logits.shape
    gamma = gamma_plus_one - 1
    assert gamma >= 0, "target_logits needs at least one position"
    assert draft_token_ids.shape == (batch, gamma), (
        f"draft_token_ids must be [B={batch}, gamma={gamma}], got {tuple(draft_token_ids.shape)}"
    )
    assert num_drafted.shape == (batch,), f"num_drafted must be [B={batch}], got {tuple(num_drafted.shape)}"
    assert sampling.batch_size == batch, f"sampling has {sampling.batch_size} rows, logits have {batch}"
    if draft_probs is not None:
        assert draft_probs.shape == (batch, gamma, vocab), (
            f"draft_probs must be [B={batch}, gamma={gamma}, V={vocab}], got {tuple(draft_probs.shape)}"
        )
    assert bool(((num_drafted >= 0) & (num_drafted <= gamma)).all()), "num_drafted must lie in [0, gamma]"
    drafted = torch.arange(gamma, device=num_drafted.device) < num_drafted[:, None]  # [B, gamma]
    ids = draft_token_ids.to(num_drafted.device)[drafted]
    assert bool(((ids >= 0) & (ids < vocab)).all()), "drafted token ids must lie in [0, V)"


def _count_leading_true(mask: Tensor) -> Tensor:
    """[B, n] bool -> [B] int64: the length of each row's all-True prefix."""
    return mask.long().cumprod(dim=-1).sum(dim=-1)


def _assemble(draft_ids: Tensor, num_accepted: Tensor, final_token: Tensor) -> Tensor:
    """Emitted tokens [B, gamma + 1]: accepted drafted tokens, the final token, then padding.

    draft_ids: [B, gamma]; num_accepted: [B]; final_token: [B] (recovered or bonus).
    """
    batch, gamma = draft_ids.shape
    positions = torch.arange(gamma + 1, device=draft_ids.device)[None, :]  # [1, gamma + 1]
    padded = torch.cat([draft_ids, final_token[:, None]], dim=1)  # [B, gamma + 1]
    out = torch.where(positions < num_accepted[:, None], padded, PAD_TOKEN_ID)
    out[torch.arange(batch, device=draft_ids.device), num_accepted] = final_token
    return out


def _verify_greedy(target_logits: Tensor, draft_ids: Tensor, drafted: Tensor) -> tuple[Tensor, Tensor]:
    """Greedy fast path, no randomness: accept while the draft equals the target argmax.

    target_logits: [Bg, gamma + 1, V]; draft_ids, drafted: [Bg, gamma].
    Returns (tokens [Bg, gamma + 1], num_accepted [Bg]).
    """
    return _accept_matching(target_logits.argmax(dim=-1), draft_ids, drafted)


def _accept_matching(target_tokens: Tensor, draft_ids: Tensor, drafted: Tensor) -> tuple[Tensor, Tensor]:
    """Accept while the drafted token equals the target's own choice at its position; the
    target's choice at the first position not accepted is the recovered or bonus token.

    target_tokens: [B, gamma + 1]; draft_ids, drafted: [B, gamma].
    Returns (tokens [B, gamma + 1], num_accepted [B])."""
    matches = (draft_ids == target_tokens[:, :-1]) & drafted  # [B, gamma]
    num_accepted = _count_leading_true(matches)  # [B]
    final_token = target_tokens.gather(1, num_accepted[:, None]).squeeze(1)  # [B]
    return _assemble(draft_ids, num_accepted, final_token), num_accepted


def _verify_coupled(
    target_logits: Tensor, draft_ids: Tensor, drafted: Tensor, sampling: SamplingBatch
) -> tuple[Tensor, Tensor]:
    """Drafter-invariant acceptance for coupled rows: accept while the draft equals the
    target's Gumbel-max token, then emit the target's token at the first other position.

    target_logits: [Bc, gamma + 1, V]; draft_ids, drafted: [Bc, gamma].
    Returns (tokens [Bc, gamma + 1], num_accepted [Bc]).
    """
    batch, gamma_plus_one, _ = target_logits.shape
    p = logits_to_probs(target_logits, sampling)  # [Bc, gamma + 1, V] float64
    columns = torch.arange(gamma_plus_one, dtype=torch.int64).expand(batch, gamma_plus_one)  # [Bc, gamma + 1]
    target_tokens = sampling.gumbel_tokens(p, columns).to(draft_ids.device)  # [Bc, gamma + 1]
    return _accept_matching(target_tokens, draft_ids, drafted)


def _verify_sampled(
    target_logits: Tensor,
    draft_ids: Tensor,
    num_drafted: Tensor,
    draft_probs: Tensor | None,
    sampling: SamplingBatch,
) -> tuple[Tensor, Tensor]:
    """Leviathan acceptance for sampled rows that are not coupled.

    target_logits: [Bs, gamma + 1, V]; draft_ids: [Bs, gamma] (padding already 0);
    num_drafted: [Bs]; draft_probs: [Bs, gamma, V] or None (one-hot q).
    Returns (tokens [Bs, gamma + 1], num_accepted [Bs]).
    """
    batch, gamma = draft_ids.shape
    p = logits_to_probs(target_logits, sampling)  # [Bs, gamma + 1, V] float64
    columns = torch.arange(gamma, dtype=torch.int64).expand(batch, gamma)  # [Bs, gamma]
    u_accept = sampling.uniforms(columns, ROLE_ACCEPT, p.device)  # [Bs, gamma]
    p_draft = p[:, :gamma].gather(-1, draft_ids[..., None]).squeeze(-1)  # [Bs, gamma]
    q = None if draft_probs is None else normalize_probs(draft_probs)  # [Bs, gamma, V] float64
    if q is None:
        q_draft = torch.ones_like(p_draft)  # one-hot q puts all mass on the drafted token
    else:
        q_draft = q.gather(-1, draft_ids[..., None]).squeeze(-1)  # [Bs, gamma]
    drafted = torch.arange(gamma, device=p.device) < num_drafted[:, None]  # [Bs, gamma]
    # u < min(1, p/q)  <=>  u * q < p, for u in [0, 1); no division by q.
    accepted = (u_accept * q_draft < p_draft) & drafted  # [Bs, gamma]
    num_accepted = _count_leading_true(accepted)  # [Bs]
    final_probs = _final_token_probs(p, draft_ids, q, num_accepted, num_drafted)  # [Bs, V]
    u_final = sampling.uniforms(num_accepted.cpu(), ROLE_FINAL, p.device)  # [Bs]
    final_token = inverse_cdf_sample(final_probs, u_final)  # [Bs]
    return _assemble(draft_ids, num_accepted, final_token), num_accepted


def _final_token_probs(
    p: Tensor,
    draft_ids: Tensor,
    draft_probs: Tensor | None,
    num_accepted: Tensor,
    num_drafted: Tensor,
) -> Tensor:
    """The distribution of each row's recovered-or-bonus token, [Bs, V] (unnormalised).

    p: [Bs, gamma + 1, V]; draft_ids: [Bs, gamma]; draft_probs: [Bs, gamma, V] normalised q or None;
    num_accepted, num_drafted: [Bs]. A rejected row (num_accepted < num_drafted) gets
    max(0, p - q) at the rejected position, or p there if that has no mass; a row whose
    drafted tokens were all accepted gets p at position num_drafted (the bonus token).
    """
    rows = torch.arange(p.shape[0], device=p.device)
    final = p[rows, num_accepted].clone()  # [Bs, V]
    rejected = (num_accepted < num_drafted).nonzero().squeeze(-1)  # [n]
    if rejected.numel() == 0:
        return final
    position = num_accepted[rejected]  # [n]
    p_rej = final[rejected]  # [n, V]
    if draft_probs is None:
        residual = p_rej.scatter(-1, draft_ids[rejected, position][:, None], 0.0)  # p - one-hot q, clipped
    else:
        residual = (p_rej - draft_probs[rejected, position]).clamp_(min=0.0)  # [n, V]
    no_mass = residual.sum(dim=-1, keepdim=True) <= 1e-12  # [n, 1] numerics guard
    final[rejected] = torch.where(no_mass, p_rej, residual)
    return final
