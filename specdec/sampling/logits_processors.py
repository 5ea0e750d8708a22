"""History-dependent logits processing: logit bias and repetition / frequency / presence penalties.

A request's processors turn the model's raw logits at a position into the logits its
tokens are drawn from, as a function of the tokens *before* that position. Under
speculation the target scores γ + 1 positions in one forward pass; position i must see
the history (prompt + generated, the pending token included) followed by the drafted
tokens d_1 .. d_i that precede it, exactly as plain decoding would have seen them had those
tokens been emitted. The processed p_i is then the very distribution plain decoding draws
the token at that position from, and the rejection sampler - which is exact for any p and
any q it is given - emits tokens that follow the processed target distribution: the
same output distribution (and, greedy or seeded, the same output) with speculation on or off.

The draft applies the same processing to its own logits (position i seeing its own
guesses before i) and reports the q it sampled from, so acceptance min(1, p/q) compares the
two processed distributions; processing the draft only raises the acceptance rate, the
exactness does not depend on it.

Order (as vLLM): logit_bias is added to the raw logits, then the penalties:
  repetition_penalty r (transformers' RepetitionPenaltyLogitsProcessor): every token that
      occurs in the prompt or the output gets logit / r when positive, logit * r otherwise;
  frequency_penalty f and presence_penalty e (OpenAI): logit - f * count - e * [count > 0],
      count = occurrences in the *output* (the tokens after the prompt).
Temperature, top-k, top-p and min_p follow in `specdec.sampling.sampling`. Token ids of logit_bias
at or beyond the vocabulary are ignored (the frontend checks them against the tokenizer).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from specdec.sampling.sampling_params import SamplingParams


def has_history_processing(params: SamplingParams) -> bool:
    """True when the params change the logits before temperature (bias or a penalty)."""
    return bool(params.logit_bias) or params.repetition_penalty != 1.0 or \
        params.frequency_penalty != 0.0 or params.presence_penalty != 0.0


@dataclass(frozen=True)
class RowProcessing:
    """One row's processing: its params and the tokens its first decided position sees.

    history: prompt + generated tokens, the pending token included.
    num_prompt_tokens: how many leading history tokens are the prompt (frequency and
        presence penalties count only the tokens after them).
    """

    params: SamplingParams
    history: Sequence[int]
    num_prompt_tokens: int

    def extended(self, tokens: Sequence[int]) -> "RowProcessing":
        """The same row, its history followed by `tokens` (the draft's guesses so far)."""
        return RowProcessing(self.params, [*self.history, *tokens], self.num_prompt_tokens)

    def counts(self, vocab: int, device: torch.device | str) -> tuple[Tensor, Tensor]:
        """(occurrences of each token in the output, [V] float64; whether it occurs
        anywhere in the history, [V] bool), token ids outside [0, V) left out."""
        output = _in_vocab(self.history[self.num_prompt_tokens :], vocab, device)
        count = torch.zeros(vocab, dtype=torch.float64, device=device).index_add_(
            0, output, torch.ones(output.numel(), dtype=torch.float64, device=device))
        seen = torch.zeros(vocab, dtype=torch.bool, device=device)
        seen[_in_vocab(self.history[: self.num_prompt_tokens], vocab, device)] = True
        return count, seen | (count > 0)


def row_processing(params: SamplingParams, history: Sequence[int], num_prompt_tokens: int) -> RowProcessing | None:
    """The row's processing, or None when its params need none (the fast path)."""
    if not has_history_processing(params):
        return None
    return RowProcessing(params, history, num_prompt_tokens)


def process_logits(logits: Tensor, rows: Sequence[RowProcessing | None], drafts: Tensor | None = None) -> Tensor:
    """Processed logits of every row at every position (float64 where a row is processed).

    logits: [B, T, V] raw logits; rows: B entries (None = leave the row as it is).
    drafts: [B, >= T - 1] int64 tokens following each row's history (valid ids, padding
        replaced by any valid id: a position never sees the padding after the tokens it
        is decided after); position t of row b sees history_b + drafts[b, :t].
    Returns a new tensor when any row is processed, else `logits` itself.
    """
    assert logits.dim() == 3 and len(rows) == logits.shape[0], "need logits [B, T, V] and B rows"
    if all(row is None for row in rows):
        return logits
    out = logits.double().clone()  # [B, T, V]
    for b, row in enumerate(rows):
        if row is not None:
            tokens = drafts[b, : logits.shape[1] - 1] if drafts is not None else drafts
            out[b] = _process_row(out[b], row, tokens)
    return out


def _process_row(logits: Tensor, row: RowProcessing, drafts: Tensor | None) -> Tensor:
    """logits [T, V] float64 of one row -> processed [T, V]; drafts: [T - 1] or None (T = 1)."""
    positions, vocab = logits.shape
    params, device = row.params, logits.device
    count, seen = row.counts(vocab, device)  # [V], [V]
    if positions > 1:  # the drafts before each position, cumulated: [T, V]
        assert drafts is not None and drafts.shape == (positions - 1,), "need T - 1 drafted tokens"
        step = torch.nn.functional.one_hot(drafts.to(device), vocab).double()  # [T - 1, V]
        before = torch.cat([torch.zeros(1, vocab, dtype=torch.float64, device=device), step.cumsum(0)])
        count = count + before  # [T, V]
        seen = seen | (before > 0)  # [T, V]
    if params.logit_bias:
        ids, bias = _bias(params, vocab, device)
        logits[:, ids] += bias
    if params.repetition_penalty != 1.0:
        r = params.repetition_penalty
        penalised = torch.where(logits > 0, logits / r, logits * r)
        logits = torch.where(seen, penalised, logits)
    return logits - params.frequency_penalty * count - params.presence_penalty * (count > 0).double()


def _bias(params: SamplingParams, vocab: int, device: torch.device | str) -> tuple[Tensor, Tensor]:
    """logit_bias as (token ids [n] int64, biases [n] float64), ids outside [0, V) left out."""
    pairs = [(int(t), float(b)) for t, b in params.logit_bias if 0 <= int(t) < vocab]
    ids = torch.tensor([t for t, _ in pairs], dtype=torch.int64, device=device)
    return ids, torch.tensor([b for _, b in pairs], dtype=torch.float64, device=device)


def _in_vocab(tokens: Sequence[int], vocab: int, device: torch.device | str) -> Tensor:
    ids = torch.as_tensor(list(tokens), dtype=torch.int64, device=device)
    return ids[(ids >= 0) & (ids < vocab)]
