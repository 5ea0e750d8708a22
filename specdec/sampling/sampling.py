"""Turning logits into token probabilities and drawing tokens, batched over sequences.

The same processing (a request's bias and penalties, `specdec.sampling.logits_processors`, at each
position over the tokens before it; then temperature, top-k, top-p and min_p) is applied to
the target's p and the draft's q before verification, so that the rejection sampler's
output follows the *processed* target distribution exactly.

Precision: probabilities, cumulative sums and uniforms are float64 (uniforms on the grid
k * 2**-53), so sampling follows p to float64 resolution (total variation < 1e-9 on 150k
tokens; a token is drawable unless its probability is below ~1e-16 of the mass before it
in vocabulary order). Temperature is applied to logits minus their
maximum, so any finite T > 0 (1e-300 included) gives the right distribution.

Randomness is addressed, not streamed (`specdec.sampling.counter_rng`): row r's uniform for the
token at history position t is a function of (seeds[r], t, role) alone, so a row's output
never depends on the rest of the batch, on retries, or on restarts.

A *coupled* row (a sampled request that gave its own seed) draws every token by Gumbel-max
under noise addressed by (seed, position, token) instead of by inverse CDF
(`specdec.sampling.gumbel_sampling`): the draft and the target share that noise, which makes the
request's output independent of what was drafted (see `specdec.sampling.rejection_sampler`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from specdec.sampling.counter_rng import ROLE_FINAL, as_seeds, uniforms
from specdec.sampling.grammar_mask import apply_masks
from specdec.sampling.gumbel_sampling import gumbel_argmax
from specdec.sampling.logits_processors import RowProcessing, process_logits, row_processing
from specdec.sampling.sampling_params import SamplingParams


@dataclass
class SamplingBatch:
    """Per-row sampling state for a batch of B sequences.

    temperature: [B] float64 (0 = greedy).
    top_k: [B] int64 (0 = off).
    top_p: [B] float64 (1.0 = off).
    greedy: [B] bool, exactly ``temperature == 0``.
    seeds: [B] uint64 numpy: each row's random key (see specdec.sampling.counter_rng).
    positions: [B] int64: the history position of the first token this call decides
        (a draw at offset i from it decides the token at positions[b] + i).
    coupled: [B] bool: the row draws by Gumbel-max under noise shared with the draft
        (specdec.sampling.gumbel_sampling); from_params sets it for sampled rows with a seed of
        their own. Never set on a greedy row. None = no coupled row. On the CPU, like
        positions (the noise is hashed there).
    token_masks: [B, T, W] int32 packed grammar masks of the positions `processed` sees
        (specdec.sampling.grammar_mask; ALL_ALLOWED words where a row has no grammar), or
        None: the forbidden tokens' logits become -inf after the processing, so every token
        drawn from p (sampled, recovered or bonus) satisfies the row's grammar.
    """

    temperature: Tensor
    top_k: Tensor
    top_p: Tensor
    greedy: Tensor
    seeds: np.ndarray
    positions: Tensor
    coupled: Tensor | None = field(default_factory=lambda: None)  # no class attribute: from_params's
    min_p: Tensor | None = field(default_factory=lambda: None)  # batches make it when first read
    processing: list[RowProcessing | None] | None = None
    token_masks: Tensor | None = None

    def __post_init__(self) -> None:
        b = len(self.seeds)
        if self.coupled is None:
            self.coupled = torch.zeros(b, dtype=torch.bool)
        if self.min_p is None:
            self.min_p = torch.zeros(b, dtype=torch.float64, device=self.temperature.device)
        assert self.processing is None or len(self.processing) == b, "need one processing entry per row"
        assert self.token_masks is None or self.token_masks.shape[0] == b, "need one mask row per row"
        assert not bool((self.coupled & self.greedy.cpu()).any()), "a greedy row cannot be coupled"
        for name in ("temperature", "top_k", "top_p", "greedy", "positions", "coupled", "min_p"):
            shape = tuple(getattr(self, name).shape)
            assert shape == (b,), f"{name} must be [batch={b}], got {shape}"
        assert self.seeds.dtype == np.uint64, "seeds must be uint64"
        assert self.greedy.dtype == torch.bool, "greedy must be a bool tensor"
        assert torch.equal(self.greedy, self.temperature == 0), "greedy must equal (temperature == 0)"

    @classmethod
    def from_params(
        cls,
        params: list[SamplingParams],
        positions: list[int] | None = None,
        device: torch.device | str = "cpu",
        histories: list[list[int]] | None = None,
        num_prompt_tokens: list[int] | None = None,
    ) -> "SamplingBatch":
        """Build the batch state from per-request params.

        positions: per row, the history position of the first token decided (default 0).
        histories / num_prompt_tokens: per row, the tokens its first decided position sees
        and how many of them are the prompt; needed by rows with penalties or logit_bias
        (their processing; default: an empty history).
        A sampled request without a seed gets a fresh random one for this call; one with
        a seed of its own is coupled (its output must not depend on what was drafted).
        """
        positions = [0] * len(params) if positions is None else list(positions)
        assert len(positions) == len(params), "need one position per row"
        histories = [[] for _ in params] if histories is None else histories
        prompts = [0] * len(params) if num_prompt_tokens is None else num_prompt_tokens
        processing = [row_processing(p, h, n) for p, h, n in zip(params, histories, prompts, strict=True)]
        batch = cls.__new__(cls)  # consistent by construction: __post_init__'s checks are not needed
        batch.__dict__.update(_params=params, _positions=positions, _device=device, token_masks=None,
                              _all_greedy=all(p.is_greedy for p in params),
                              processing=processing if any(r is not None for r in processing) else None)
        return batch

    _LAZY = frozenset({"temperature", "top_k", "top_p", "greedy", "seeds", "positions", "coupled", "min_p"})

    def __getattr__(self, name: str):
        """A batch from `from_params` makes its tensors when first read: a round of greedy
        rows without processing reads none of them (the sampler's fast paths), and each
        tensor costs microseconds of host time per round."""
        if name not in SamplingBatch._LAZY or "_params" not in self.__dict__:
            raise AttributeError(name)
        params, device = self.__dict__.pop("_params"), self._device
        floats = torch.tensor([[p.temperature for p in params], [p.top_p for p in params],
                               [p.min_p for p in params]], dtype=torch.float64, device=device)  # [3, B]
        temperature, top_p, min_p = floats.unbind(0)
        sampled = not self._all_greedy
        self.__dict__.update(
            temperature=temperature, top_p=top_p, min_p=min_p, greedy=temperature == 0,
            top_k=torch.tensor([p.top_k for p in params], dtype=torch.int64, device=device),
            seeds=as_seeds([_seed_of(p) for p in params]) if sampled else np.zeros(len(params), dtype=np.uint64),
            positions=torch.tensor(self._positions, dtype=torch.int64),
            coupled=torch.tensor([p.seed is not None and not p.is_greedy for p in params], dtype=torch.bool)
            if sampled else torch.zeros(len(params), dtype=torch.bool))
        return self.__dict__[name]

    @property
    def batch_size(self) -> int:
        return len(self._positions) if "_positions" in self.__dict__ else len(self.seeds)

    @property
    def all_greedy(self) -> bool:
        """True when every row is greedy (so no probabilities are needed at all)."""
        known = self.__dict__.get("_all_greedy")
        return known if known is not None else bool(self.greedy.all())

    def select(self, rows: Tensor | slice) -> "SamplingBatch":
        """The sub-batch of the given row indices ([n] int64, in that order); a slice(None)
        (see row_index) returns the batch itself."""
        if isinstance(rows, slice):
            assert rows == slice(None), "only slice(None) is supported"
            return self
        index = rows.cpu()
        return SamplingBatch(
            temperature=self.temperature[rows],
            top_k=self.top_k[rows],
            top_p=self.top_p[rows],
            greedy=self.greedy[rows],
            seeds=self.seeds[index.numpy()],
            positions=self.positions[index],
            coupled=self.coupled[index],
            min_p=self.min_p[rows],
            processing=None if self.processing is None else [self.processing[i] for i in index.tolist()],
            token_masks=None if self.token_masks is None else self.token_masks[index],
        )

    def processed(self, logits: Tensor, drafts: Tensor | None = None) -> Tensor:
        """The rows' history-dependent processing applied (specdec.sampling.logits_processors):
        logits [B, T, V] -> [B, T, V], position t of row b seeing its history + drafts[b, :t]
        (drafts [B, >= T - 1] valid ids), then the grammar masks (token_masks[:, :T]). The
        logits themselves when no row has either."""
        if self.processing is not None:
            logits = process_logits(logits, self.processing, drafts)
        if self.token_masks is not None:
            logits = apply_masks(logits, self.token_masks[:, : logits.shape[1]])
        return logits

    def processed_after(self, logits: Tensor, guesses: Tensor) -> Tensor:
        """Row b's logits [B, V] at the position after its history + guesses[b] ([B, n]
        valid ids: what a draft guessed so far this call), processed -> [B, V]."""
        if self.processing is None:
            return logits
        rows = [None if r is None else r.extended(g) for r, g in zip(self.processing, guesses.tolist())]
        return process_logits(logits[:, None], rows)[:, 0]

    def uniforms(self, offsets: Tensor, role: int, device: torch.device | str = "cpu") -> Tensor:
        """Row b's uniforms for the tokens at positions[b] + offsets[b] ([B] or [B, n] int64)
        in the given role (specdec.sampling.counter_rng), as float64 on `device`."""
        positions = self._positions_at(offsets)
        return torch.from_numpy(uniforms(self.seeds, positions.numpy(), role)).to(device)

    def gumbel_tokens(self, probs: Tensor, offsets: Tensor) -> Tensor:
        """Row b's Gumbel-max tokens (specdec.sampling.gumbel_sampling) of probs ([B, V] or [B, n, V])
        for the tokens at positions[b] + offsets[b] ([B] or [B, n] int64), on probs' device."""
        return gumbel_argmax(probs, self.seeds, self._positions_at(offsets))

    def _positions_at(self, offsets: Tensor) -> Tensor:
        """positions[b] + offsets[b] on the CPU, shaped like offsets ([B] or [B, n])."""
        assert offsets.shape[:1] == (self.batch_size,), "offsets must be [B] or [B, n]"
        return self.positions.reshape((-1,) + (1,) * (offsets.dim() - 1)) + offsets.cpu()


def _seed_of(params: SamplingParams) -> int:
    """The row's random key: its seed; a fresh one when unseeded; 0 for greedy rows, which
    draw nothing (so the hot path makes no RNG call for them)."""
    if params.seed is not None:
        return params.seed
    return 0 if params.is_greedy else random_seed()


def random_seed() -> int:
    """A fresh seed for a request that did not set one (from torch's global RNG)."""
    return int(torch.randint(0, 2**62, (1,)))


def row_index(mask: Tensor) -> Tensor | slice:
    """Index selecting the rows where mask ([B] bool) is True: slice(None) when all rows
    are selected (so indexing is a free view, not a copy), else an [n] int64 tensor."""
    if bool(mask.all()):
        return slice(None)
    return mask.nonzero().squeeze(-1)


def logits_to_probs(logits: Tensor, batch: SamplingBatch) -> Tensor:
    """Processed probabilities: temperature, then top-k, then top-p, then min_p, renormalised.

    logits: [B, V] or [B, T, V] (any float dtype; -inf entries are allowed).
    Returns float64 probabilities of the same shape. Row b's parameters apply at all of
    its T positions. Greedy rows become one-hot at the argmax of the logits. History-
    dependent processing (penalties, bias) is not applied here: pass batch.processed(logits).
    Top-k keeps the k highest logits; top-p then keeps the smallest set of most likely
    tokens whose (top-k renormalised) probability reaches top_p, always at least the top
    token. Tokens tied with the last kept token are kept too.
    """
    assert logits.dim() in (2, 3), f"logits must be [B, V] or [B, T, V], got {tuple(logits.shape)}"
    assert logits.shape[0] == batch.batch_size, "logits and sampling batch disagree on B"
    squeeze = logits.dim() == 2
    raw = logits.unsqueeze(1) if squeeze else logits  # [B, T, V]
    greedy = batch.greedy.to(raw.device)  # [B]
    probs = torch.empty(raw.shape, dtype=torch.float64, device=raw.device)  # [B, T, V]
    if bool(greedy.any()):
        rows = row_index(greedy)
        argmax = raw[rows].argmax(dim=-1, keepdim=True)  # [G, T, 1]
        probs[rows] = torch.zeros_like(probs[rows]).scatter_(-1, argmax, 1.0)
    if not bool(greedy.all()):
        rows = row_index(~greedy)
        probs[rows] = _sampled_probs(raw[rows], batch.select(rows))
    return probs.squeeze(1) if squeeze else probs


def _sampled_probs(logits: Tensor, batch: SamplingBatch) -> Tensor:
    """Temperature, top-k, top-p and min_p for rows that are all non-greedy.

    logits: [S, T, V]; returns float64 probabilities [S, T, V]. The logits are shifted so
    that their maximum is 0 before dividing by T: every scaled value is then <= 0, so no
    temperature overflows (a tiny T sends all but the top tokens to -inf, as it should).
    """
    device = logits.device
    shifted = logits.double()
    if bool((torch.isnan(shifted) | (shifted == float("inf"))).any()):
        raise ValueError("logits contain NaN or +inf: the model's output is broken for this row")
    shifted = shifted - shifted.amax(dim=-1, keepdim=True)  # [S, T, V], max 0 per position
    scaled = shifted / batch.temperature.to(device)[:, None, None]  # [S, T, V]
    filtered = (batch.top_k > 0) | (batch.top_p < 1.0)  # [S]
    if bool(filtered.any()):
        rows = row_index(filtered.to(device))
        top_k, top_p = batch.top_k.to(device)[rows], batch.top_p.to(device)[rows]
        scaled[rows] = _mask_top_k_top_p(scaled[rows], top_k, top_p)
    if bool((batch.min_p > 0).any()):
        # the top token's scaled logit is 0: p(v) >= min_p * p(top)  <=>  scaled(v) >= log(min_p)
        floor = torch.log(batch.min_p.to(device))[:, None, None]  # [S, 1, 1], -inf where off
        scaled = scaled.masked_fill(scaled < floor, float("-inf"))
    return torch.softmax(scaled, dim=-1)


def _mask_top_k_top_p(logits: Tensor, top_k: Tensor, top_p: Tensor) -> Tensor:
    """Set the logits outside each row's top-k / top-p set to -inf.

    logits: [R, T, V] float64 (temperature already applied); top_k: [R]; top_p: [R].
    Both filters reduce to a threshold on the logit, so tokens tied with the last kept
    token are kept too and the result does not depend on how ties are ordered.
    """
    vocab = logits.shape[-1]
    k = torch.where(top_k > 0, top_k.clamp(max=vocab), torch.full_like(top_k, vocab))  # [R]
    width = int(k.max())
    top = _largest(logits, width)  # [R, T, width], descending
    kth_index = (k - 1)[:, None, None].expand(-1, logits.shape[1], 1)  # [R, T, 1]
    threshold = top.gather(-1, kth_index)  # [R, T, 1]: the k-th largest logit
    if bool((top_p < 1.0).any()):
        # top-p over the whole top-k set, tokens tied with the k-th included
        kept = int((logits >= threshold).sum(dim=-1).max())
        candidates = _largest(logits, kept)  # [R, T, kept], descending
        candidates = candidates.masked_fill(candidates < threshold, float("-inf"))  # [R, T, kept]
        threshold = torch.maximum(threshold, _top_p_threshold(candidates, top_p))
    return logits.masked_fill(logits < threshold, float("-inf"))


def _largest(logits: Tensor, n: int) -> Tensor:
    """The n largest values on the last axis, descending (a full sort when n is all of it)."""
    if n < logits.shape[-1]:
        return logits.topk(n, dim=-1).values
    return logits.sort(dim=-1, descending=True).values


def _top_p_threshold(sorted_logits: Tensor, top_p: Tensor) -> Tensor:
    """The smallest logit of each row's top-p set, [R, T, 1] (-inf where top_p is off).

    sorted_logits: [R, T, W] descending (already top-k filtered); top_p: [R]. The set is
    the shortest prefix whose probability reaches top_p, and never empty.
    """
    sorted_probs = torch.softmax(sorted_logits, dim=-1)  # [R, T, W]
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs  # exclusive cumsum, [R, T, W]
    num_kept = (mass_before < top_p[:, None, None]).sum(dim=-1, keepdim=True).clamp_(min=1)  # [R, T, 1]
    threshold = sorted_logits.gather(-1, num_kept - 1)  # [R, T, 1]
    return threshold.masked_fill((top_p >= 1.0)[:, None, None], float("-inf"))


def normalize_probs(weights: Tensor) -> Tensor:
    """[..., V] non-negative weights -> float64 probabilities summing to 1 on the last axis.

    The draft samples from normalize_probs(w) and the verifier tests with normalize_probs(w)
    of the very same w (e.g. after a float16 wire round trip), so both use the same q."""
    weights = weights.double()
    total = weights.sum(dim=-1, keepdim=True)
    return weights / total.where(total > 0, 1.0)  # an all-zero row (padding) stays zero


def inverse_cdf_sample(probs: Tensor, u: Tensor) -> Tensor:
    """Draw tokens from (possibly unnormalised) probs, given uniforms u, in float64.

    probs: [B, V] non-negative with positive mass per row; u: [B] or [B, n] in [0, 1).
    Returns int64 tokens shaped like u: for each u, the first token whose cumulative mass
    exceeds u * total mass. Tokens of zero probability are never returned.
    """
    assert probs.dim() == 2 and u.shape[:1] == probs.shape[:1] and u.dim() in (1, 2), (
        f"need probs [B, V] and u [B] or [B, n], got {tuple(probs.shape)}, {tuple(u.shape)}"
    )
    probs = probs.double()
    cdf = probs.cumsum(dim=-1)  # [B, V]
    if not bool((torch.isfinite(cdf[:, -1]) & (cdf[:, -1] > 0)).all()):
        raise ValueError("cannot sample from a row without finite, positive probability mass")
    u2 = u.to(device=cdf.device, dtype=torch.float64).reshape(u.shape[0], -1)  # [B, n]
    target = u2 * cdf[:, -1:]  # [B, n]
    tokens = torch.searchsorted(cdf, target, right=True).clamp_(max=probs.shape[-1] - 1)  # [B, n]
    # Rounding can push the target past the last positive cell; land on that cell instead.
    landed_on_zero = probs.gather(-1, tokens) <= 0  # [B, n]
    if bool(landed_on_zero.any()):
        positive = probs > 0  # [B, V]
        if not bool(positive.any(dim=-1).all()):
            raise ValueError("cannot sample from a row with no probability mass")
        last = probs.shape[-1] - 1 - positive.flip(-1).int().argmax(dim=-1, keepdim=True)  # [B, 1]
        tokens = torch.where(landed_on_zero, last.expand_as(tokens), tokens)
    return tokens.reshape(u.shape)


def sample_from_probs(probs: Tensor, batch: SamplingBatch, offset: int = 0, role: int = ROLE_FINAL) -> Tensor:
    """Draw one token per row: [B, V] probs -> [B] int64.

    Row b decides the token at history position batch.positions[b] + offset and uses the
    uniform addressed by (its seed, that position, role). Greedy rows take the argmax;
    coupled rows the Gumbel-max token at that position (whatever the role: the draft's
    guess and the target's token share their noise).
    """
    assert probs.dim() == 2 and probs.shape[0] == batch.batch_size, f"probs must be [B, V], got {tuple(probs.shape)}"
    tokens = probs.argmax(dim=-1)  # [B]
    coupled = batch.coupled.nonzero().squeeze(-1)  # [C]
    if coupled.numel() > 0:
        offsets = torch.full((coupled.numel(),), offset, dtype=torch.int64)
        rows = coupled.to(probs.device)
        tokens[rows] = batch.select(coupled).gumbel_tokens(probs[rows], offsets).to(probs.device)
    sampled = (~batch.greedy.cpu() & ~batch.coupled).nonzero().squeeze(-1)  # [S]
    if sampled.numel() > 0:
        sub = batch.select(sampled)
        offsets = torch.full((sampled.numel(),), offset, dtype=torch.int64)
        u = sub.uniforms(offsets, role, probs.device)  # [S]
        tokens[sampled.to(probs.device)] = inverse_cdf_sample(probs[sampled.to(probs.device)], u)
    return tokens
