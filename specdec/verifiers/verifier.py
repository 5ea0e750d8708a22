"""The Verifier interface: the target side of a round.

A verifier owns the target model's per-sequence state (its cache slot). Each
round it receives every active sequence's history and drafted tokens, scores them in one
batched target forward, runs the acceptance test and rolls its cache back to the accepted
prefix. In-process this is `TargetVerifier`; in the distributed system it is a gRPC client
of the tensor-parallel target group.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Protocol

import torch

from specdec.proposers.drafts import EncodedQ
from specdec.sampling.sampling_params import SamplingParams
from specdec.sampling.token_logprobs import TokenLogprob


@dataclass
class VerifyRequest:
    """One sequence's part of a round.

    token_ids: the full history (prompt + generated); the last one is the pending token.
    draft_token_ids: the drafted tokens to verify (may be empty: plain decoding).
    draft_probs: the draft distribution q of the drafted tokens, as the proposer made it
        (Drafts.q): [num_drafted, vocab] non-negative weights (the verifier normalises them,
        exactly as the proposer did before sampling), the same still encoded (EncodedQ: a
        remote draft's bytes, decoded by the verifier), or None (verified as a one-hot q).
    num_prompt_tokens: how many leading history tokens are the prompt (frequency and
        presence penalties count only the tokens after them).
    logprobs: None, or how many alternatives to report with each emitted token's logprob
        (VerifyResult.logprobs; specdec.sampling.token_logprobs).
    token_mask: the row's grammar masks, [num_drafted + 1, W] int32 packed (position i: the
        tokens allowed after the history and the drafted tokens before it;
        specdec.sampling.grammar_mask), or None (no grammar). The target's distribution is
        masked by them at every position, so every emitted token satisfies the grammar.
    reserve_tokens: the tokens the engine reserved for the sequence (its grant, at most prompt +
        max_new_tokens); a verifier that first sees the sequence reserves that much cache for it
        (None: max_seq_len); a larger one later was raised by `Verifier.grow` in-process, and a
        target that holds less (a remote router grew it on its side) raises it before the round
        writes.
    prompt_logprobs: None, or how many alternatives to report with the logprobs of the
        history tokens from position `prompt_logprobs_from` to the pending token
        (VerifyResult.prompt_logprobs): the target reads them again from position
        `prompt_logprobs_from - 1` (not from the prefix cache), so each is predicted by a
        position this call computes, whatever the slot held before.
    prompt_logprobs_from: the first history position whose logprob is wanted (the tokens
        before it were reported by earlier calls; position 0 has none: None is reported).
    """

    seq_id: str
    token_ids: list[int]
    draft_token_ids: list[int]
    sampling: SamplingParams
    draft_probs: torch.Tensor | EncodedQ | None = None
    num_prompt_tokens: int = 0
    logprobs: int | None = None
    token_mask: torch.Tensor | None = None
    reserve_tokens: int | None = None
    prompt_logprobs: int | None = None
    prompt_logprobs_from: int = 0


@dataclass
class VerifyResult:
    """num_accepted drafted tokens were kept; emitted = those + one recovered-or-bonus token.
    logprobs: one per emitted token when the request asked for them, else None.
    cached_tokens: history tokens the target took from its prefix cache instead of computing
    them, since it took the sequence in (0 without prefix caching).
    prompt_logprobs: when the request asked for them, one per history token from
    prompt_logprobs_from to the pending token (None for position 0), else None."""

    seq_id: str
    emitted: list[int]
    num_accepted: int
    logprobs: list[TokenLogprob] | None = None
    cached_tokens: int = 0
    prompt_logprobs: list[TokenLogprob | None] | None = None


class PendingVerify(Protocol):
    """A verify call in flight."""

    def result(self) -> list["VerifyResult"]:
        """Wait for the results (raises what the call raised)."""


class _Done:
    def __init__(self, results: list["VerifyResult"]) -> None:
        self._results = results

    def result(self) -> list["VerifyResult"]:
        return self._results


class Verifier(ABC):
    """Scores drafted tokens with the target and keeps the longest acceptable prefix."""

    vocab_size: int
    max_seq_len: int
    #: True when verify_async returns while the target still works (a remote target), so
    #: the caller can draft ahead meanwhile.
    runs_concurrently: bool = False
    #: why the target cannot verify now (a remote target is unreachable), or None; health
    #: reports NOT_SERVING while it is set
    unavailable_reason: str | None = None

    def verify_async(self, requests: list["VerifyRequest"]) -> PendingVerify:
        """Start verify(requests); the default runs it to completion first."""
        return _Done(self.verify(requests))

    @property
    @abstractmethod
    def num_free_slots(self) -> int:
        """How many more sequences can start now."""

    def admits(self, reserve_tokens: list[int]) -> int:
        """How many of these new sequences (each's VerifyRequest.reserve_tokens, in order) can start
        now; a paged target counts the cache blocks their reserves need, this default free slots."""
        return min(len(reserve_tokens), self.num_free_slots)

    @property
    def grows_reserves(self) -> bool:
        """True when `grow` can raise a held sequence's reserve: the engine then admits on less
        than a request's full reserve and preempts when growth does not fit (False: full reserves)."""
        return False

    def grow(self, reserves: list[tuple[str, int]], taken: list[int]) -> int:
        """Raise held sequences' reserves ((seq_id, tokens), in order) while the cache covers the
        increase after ``taken`` reserves of sequences it does not hold yet; how many were raised.
        Only called when `grows_reserves`."""
        raise NotImplementedError(f"{type(self).__name__} cannot grow reserves")

    @abstractmethod
    def verify(self, requests: list[VerifyRequest]) -> list[VerifyResult]:
        """One round for every request, batched into one target forward."""

    @abstractmethod
    def release(self, seq_id: str) -> None:
        """Forget a finished or cancelled sequence and free its slot (unknown ids are ignored)."""
