"""Turning logits into token probabilities and drawing tokens, batched over sequences.

The same processing (temperature, then top-k, then top-p) is applied to the target's p and
the draft's q before verification, so that the rejection sampler's output follows the
*processed* target distribution exactly.

Randomness is per row: row r draws only from ``generators[r]`` (a request's own seeded
``torch.Generator``), so a seeded request's output depends on its seed alone and not on
which other requests share the batch. Rows whose generator is None share one batched draw
from the global RNG, which keeps large unseeded batches fast.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from specdec.sampling_params import SamplingParams

Generators = list[torch.Generator | None]


@dataclass
class SamplingBatch:
    """Per-row sampling state for a batch of B sequences.

    temperature: [B] float32 (0 = greedy).
    top_k: [B] int64 (0 = off).
    top_p: [B] float32 (1.0 = off).
    greedy: [B] bool, exactly ``temperature == 0``.
    generators: per row; None = use the global RNG.
    """

    temperature: Tensor
    top_k: Tensor
    top_p: Tensor
    greedy: Tensor
    generators: Generators

    def __post_init__(self) -> None:
        b = len(self.generators)
        for name in ("temperature", "top_k", "top_p", "greedy"):
            shape = tuple(getattr(self, name).shape)
            assert shape == (b,), f"{name} must be [batch={b}], got {shape}"
        assert self.greedy.dtype == torch.bool, "greedy must be a bool tensor"
        assert torch.equal(self.greedy, self.temperature == 0), "greedy must equal (temperature == 0)"

    @classmethod
    def from_params(
        cls,
        params: list[SamplingParams],
        generators: Generators | None = None,
        device: torch.device | str = "cpu",
    ) -> "SamplingBatch":
        """Build the batch state from per-request params.

        generators: the requests' own generators, kept by the caller across rounds. When
        omitted, a fresh generator is seeded from each ``params[r].seed`` (None when the
        request has no seed) - right for a single call, but a caller running many rounds
        must keep and pass the same generators so that the random stream continues.
        """
        if generators is None:
            generators = [seeded_generator(p.seed) for p in params]
        assert len(generators) == len(params), "need one generator (or None) per row"
        temperature = torch.tensor([p.temperature for p in params], dtype=torch.float32, device=device)
        return cls(
            temperature=temperature,
            top_k=torch.tensor([p.top_k for p in params], dtype=torch.int64, device=device),
            top_p=torch.tensor([p.top_p for p in params], dtype=torch.float32, device=device),
            greedy=temperature == 0,
            generators=list(generators),
        )

    @property
    def batch_size(self) -> int:
        return len(self.generators)

    @property
    def all_greedy(self) -> bool:
        """True when every row is greedy (so no probabilities are needed at all)."""
        return bool(self.greedy.all())

    def select(self, rows: Tensor | slice) -> "SamplingBatch":
        """The sub-batch of the given row indices ([n] int64, in that order); a slice(None)
        (see row_index) returns the batch itself."""
        if isinstance(rows, slice):
            assert rows == slice(None), "only slice(None) is supported"
            return self
        index = rows.tolist()
        return SamplingBatch(
            temperature=self.temperature[rows],
            top_k=self.top_k[rows],
            top_p=self.top_p[rows],
            greedy=self.greedy[rows],
            generators=[self.generators[i] for i in index],
        )


def row_index(mask: Tensor) -> Tensor | slice:
    """Index selecting the rows where mask ([B] bool) is True: slice(None) when all rows
    are selected (so indexing is a free view, not a copy), else an [n] int64 tensor."""
    if bool(mask.all()):
        return slice(None)
    return mask.nonzero().squeeze(-1)


def seeded_generator(seed: int | None, offset: int = 0) -> torch.Generator | None:
    """A request's generator for one side (target: offset 0, draft: its own offset) so each
    side has its own stream from the one seed; None (unseeded) = the global RNG."""
    return None if seed is None else torch.Generator().manual_seed(seed + offset)


def logits_to_probs(logits: Tensor, batch: SamplingBatch) -> Tensor:
    """Processed probabilities: temperature, then top-k, then top-p, renormalised.

    logits: [B, V] or [B, T, V] (any float dtype; -inf entries are allowed).
    Returns float32 probabilities of the same shape. Row b's parameters apply at all of
    its T positions. Greedy rows become one-hot at the argmax of the raw logits.
    Top-k keeps the k highest logits; top-p then keeps the smallest set of most likely
    tokens whose (top-k renormalised) probability reaches top_p, always at least the top
    token. Tokens tied with the last kept token are kept too.
    """
    assert logits.dim() in (2, 3), f"logits must be [B, V] or [B, T, V], got {tuple(logits.shape)}"
    assert logits.shape[0] == batch.batch_size, "logits and sampling batch disagree on B"
    squeeze = logits.dim() == 2
    raw = logits.unsqueeze(1) if squeeze else logits  # [B, T, V]
    greedy = batch.greedy.to(raw.device)  # [B]
    probs = torch.empty(raw.shape, dtype=torch.float32, device=raw.device)  # [B, T, V]
    if bool(greedy.any()):
        rows = row_index(greedy)
        argmax = raw[rows].argmax(dim=-1, keepdim=True)  # [G, T, 1]
        probs[rows] = torch.zeros_like(probs[rows]).scatter_(-1, argmax, 1.0)
    if not bool(greedy.all()):
        rows = row_index(~greedy)
        sub = batch.select(rows.cpu() if isinstance(rows, Tensor) else rows)
        probs[rows] = _sampled_probs(raw[rows], sub)
    return probs.squeeze(1) if squeeze else probs


def _sampled_probs(logits: Tensor, batch: SamplingBatch) -> Tensor:
    """Temperature, top-k and top-p for rows that are all non-greedy.

    logits: [S, T, V]; returns float32 probabilities [S, T, V].
    """
    device = logits.device
    scaled = logits.float() / batch.temperature.to(device)[:, None, None]  # [S, T, V]
    filtered = (batch.top_k > 0) | (batch.top_p < 1.0)  # [S]
    if bool(filtered.any()):
        rows = row_index(filtered.to(device))
        top_k, top_p = batch.top_k.to(device)[rows], batch.top_p.to(device)[rows]
        scaled[rows] = _mask_top_k_top_p(scaled[rows], top_k, top_p)
    return torch.softmax(scaled, dim=-1)


def _mask_top_k_top_p(logits: Tensor, top_k: Tensor, top_p: Tensor) -> Tensor:
    """Set the logits outside each row's top-k / top-p set to -inf.

    logits: [R, T, V] float32 (temperature already applied); top_k: [R]; top_p: [R].
    Both filters reduce to a threshold on the logit, so tokens tied with the last kept
    token are kept too and the result does not depend on how ties are ordered.
    """
    vocab = logits.shape[-1]
    k = torch.where(top_k > 0, top_k.clamp(max=vocab), torch.full_like(top_k, vocab))  # [R]
    width = int(k.max())
    if width < vocab:
        candidates = logits.topk(width, dim=-1).values  # [R, T, width], descending
    else:
        candidates = logits.sort(dim=-1, descending=True).values  # [R, T, V]
    kth_index = (k - 1)[:, None, None].expand(-1, logits.shape[1], 1)  # [R, T, 1]
    threshold = candidates.gather(-1, kth_index)  # [R, T, 1]: the k-th largest logit
    if bool((top_p < 1.0).any()):
        candidates = candidates.masked_fill(candidates < threshold, float("-inf"))
        threshold = torch.maximum(threshold, _top_p_threshold(candidates, top_p))
    return logits.masked_fill(logits < threshold, float("-inf"))


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


def uniform(
    batch_size: int,
    n: int,
    generators: Generators,
    device: torch.device | str = "cpu",
) -> Tensor:
    """[batch_size, n] float32 uniforms in [0, 1); row r drawn from generators[r].

    Rows whose generator is None share one batched draw from the global RNG. A seeded
    row draws exactly n numbers from its own generator, on the generator's device.
    """
    assert len(generators) == batch_size, "need one generator (or None) per row"
    out = torch.empty(batch_size, n, dtype=torch.float32, device=device)  # [B, n]
    shared = [r for r, g in enumerate(generators) if g is None]
    if len(shared) == batch_size:
        return torch.rand(batch_size, n, device=device)
    if shared:
        out[shared] = torch.rand(len(shared), n, device=device)
    seeded = [r for r, g in enumerate(generators) if g is not None]
    if seeded:
        draws = [torch.rand(n, generator=generators[r], device=generators[r].device).to(device) for r in seeded]
        out[seeded] = torch.stack(draws)  # [len(seeded), n]
    return out


def normalize_probs(weights: Tensor) -> Tensor:
    """[..., V] non-negative weights -> probabilities summing to 1 on the last axis.

    The draft samples from normalize_probs(w) and the verifier tests with normalize_probs(w)
    of the very same w (e.g. after a float16 wire round trip), so both use the same q."""
    return weights.float() / weights.float().sum(dim=-1, keepdim=True)


def inverse_cdf_sample(probs: Tensor, u: Tensor) -> Tensor:
    """Draw one token per row from (possibly unnormalised) probs, given uniforms u.

    probs: [B, V] non-negative with positive mass per row; u: [B] in [0, 1).
    Returns [B] int64: the first token whose cumulative mass exceeds u * total mass.
    Tokens of zero probability are never returned.
    """
    assert probs.dim() == 2 and u.shape == probs.shape[:1], (
        f"need probs [B, V] and u [B], got {tuple(probs.shape)}, {tuple(u.shape)}"
    )
    probs = probs.float()
    cdf = probs.cumsum(dim=-1)  # [B, V]
    target = (u.to(cdf.device) * cdf[:, -1]).unsqueeze(-1)  # [B, 1]
    tokens = torch.searchsorted(cdf, target, right=True).squeeze(-1).clamp_(max=probs.shape[-1] - 1)  # [B]
    # Rounding can push the target past the last positive cell; land on that cell instead.
    landed_on_zero = probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1) <= 0  # [B]
    if bool(landed_on_zero.any()):
        positive = probs[landed_on_zero] > 0  # [n, V]
        if not bool(positive.any(dim=-1).all()):
            raise ValueError("cannot sample from a row with no probability mass")
        last = probs.shape[-1] - 1 - positive.flip(-1).int().argmax(dim=-1)
        tokens[landed_on_zero] = last
    return tokens


def sample_from_probs(probs: Tensor, generators: Generators, greedy: Tensor | None = None) -> Tensor:
    """Draw one token per row: [B, V] probs -> [B] int64, row r from generators[r].

    Each sampled row consumes exactly one uniform from its generator (inverse CDF).
    greedy: optional [B] bool; those rows take the argmax and consume no randomness.
    """
    assert probs.dim() == 2, f"probs must be [B, V], got {tuple(probs.shape)}"
    assert len(generators) == probs.shape[0], "need one generator (or None) per row"
    if greedy is None:
        return inverse_cdf_sample(probs, uniform(probs.shape[0], 1, generators, probs.device)[:, 0])
    assert greedy.shape == probs.shape[:1], "greedy must be [B]"
    tokens = probs.argmax(dim=-1)  # [B]
    sampled = (~greedy).nonzero().squeeze(-1)  # [S]
    if sampled.numel() > 0:
        gens = [generators[r] for r in sampled.tolist()]
        u = uniform(sampled.numel(), 1, gens, probs.device)[:, 0]  # [S]
        tokens[sampled] = inverse_cdf_sample(probs[sampled], u)
    return tokens
