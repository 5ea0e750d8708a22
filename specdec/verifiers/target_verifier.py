"""TargetVerifier: the in-process Verifier over a target ModelRunner and the rejection sampler.

The target trusts nothing it is sent: drafted tokens outside the vocabulary or the
context, and draft distributions q that do not decode (a remote draft's bytes are decoded
here, once, right before rejection sampling), are not finite, non-negative and normalised
(within Q_SUM_TOLERANCE), or give a drafted token no probability, are not verified. That row
is verified as if it had no drafts (plain decoding, still exact) and counted in
`rejected_proposals`.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

import torch

from specdec.models.kv_cache import CacheFullError
from specdec.models.model_runner import ModelRunner
from specdec.sampling.grammar_mask import batch_masks
from specdec.sampling.grammar_matcher import mask_width
from specdec.sampling.rejection_sampler import greedy_verdicts, rejection_sample
from specdec.sampling.sampling import SamplingBatch
from specdec.sampling.token_logprobs import emitted_logprobs, prompt_logprobs
from specdec.verifiers.verifier import Verifier, VerifyRequest, VerifyResult

logger = logging.getLogger(__name__)

Q_SUM_TOLERANCE = 1e-2  # |sum(q) - 1| allowed for a draft distribution (float16 rounding is ~1e-3)


@dataclass
class _TargetState:
    slot: int
    reserve: int | None = None  # the tokens its cache may grow to (None: max_seq_len, never raised)


class TargetVerifier(Verifier):
    """The target's slot cache holds each sequence's history minus its pending token.

    Sequences it has not seen (new ones, or all of them after a restart) are prefilled from
    the history they arrive with; a cache that is ahead of the history (a lost reply) is
    rolled back to it. So the caller's history is always the source of truth.
    """

    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner
        self.vocab_size = runner.vocab_size
        self.max_seq_len = runner.max_seq_len
        self._states: dict[str, _TargetState] = {}
        self.rejected_proposals = 0  # rows whose drafts failed validation (verified without them)

    @property
    def num_free_slots(self) -> int:
        return self.runner.num_free_slots

    def admits(self, reserve_tokens: list[int]) -> int:
        return self.runner.admits(reserve_tokens)

    @property
    def grows_reserves(self) -> bool:
        return hasattr(self.runner, "grow_reserves")

    def grow(self, reserves: list[tuple[str, int]], taken: list[int]) -> int:
        """A sequence not held yet counts as a new one taking that reserve (before the held ones)."""
        held = [i for i, (seq_id, _) in enumerate(reserves) if seq_id in self._states]
        new = [tokens for seq_id, tokens in reserves if seq_id not in self._states]
        grown = self.runner.grow_reserves([(self._states[reserves[i][0]].slot, reserves[i][1]) for i in held],
                                          [*taken, *new])
        for i in held[:grown]:
            state = self._states[reserves[i][0]]
            state.reserve = max(state.reserve or 0, reserves[i][1])
        return held[grown] if grown < len(held) else len(reserves)

    def _grow_held(self, requests: list[VerifyRequest]) -> None:
        """Raise the reserve of each held sequence whose request grants more than it holds (a
        remote router grows grants on its side and sends them with the round: HistoryDelta's
        reserve_tokens). A grant the cache cannot cover fails the call with CacheFullError naming
        the row before anything changed, so the caller's row isolation fails that row alone (a
        router counting on its share of the blocks never sends one)."""
        rows = [(r.seq_id, r.reserve_tokens) for r in requests
                if r.seq_id in self._states and r.reserve_tokens and self._states[r.seq_id].reserve is not None
                and r.reserve_tokens > self._states[r.seq_id].reserve]
        if not rows or not self.grows_reserves:
            return
        grown = self.grow(rows, [])
        if grown < len(rows):
            seq_id, tokens = rows[grown]
            raise CacheFullError(f"sequence {seq_id}: the cache cannot grow its reserve to {tokens} tokens")

    @property
    def cache_usage(self) -> float:
        """Share of the target's cache taken or reserved by live sequences (blocks, not slots)."""
        return self.runner.cache_usage

    @property
    def block_capacity(self) -> tuple[int, int]:
        """(blocks, tokens per block) of the target's paged cache; (0, 0) when it counts slots."""
        return self.runner.block_capacity

    @property
    def num_slots(self) -> int:
        return self.runner.cache.num_slots

    @property
    def runner_kind(self) -> str:
        """The runtime serving the target: "specdec" (own) or "transformers" (fallback)."""
        return self.runner.runner_kind

    def active_sequences(self) -> list[str]:
        return list(self._states)

    def verify(self, requests: list[VerifyRequest]) -> list[VerifyResult]:
        if not requests:
            return []
        requests = [self._checked(r) for r in requests]
        self._grow_held(requests)
        states, prompt_logprobs, riding = self._sync(requests)
        slots = [s.slot for s in states]
        old_lengths = [len(r.token_ids) - 1 for r in requests]
        rows = [[*riding.get(i, ()), r.token_ids[-1], *r.draft_token_ids] for i, r in enumerate(requests)]
        logits = self.runner.forward(slots, rows)  # [B, T, V]
        if riding:  # a riding row's verdict positions start after its catch-up
            logits = _shifted(logits, [len(riding.get(i, ())) for i in range(len(requests))])
        sampling = SamplingBatch.from_params([r.sampling for r in requests], [len(r.token_ids) for r in requests],
                                             histories=[r.token_ids for r in requests],
                                             num_prompt_tokens=[r.num_prompt_tokens for r in requests])
        if sampling.all_greedy and sampling.processing is None and all(r.token_mask is None for r in requests):
            emitted, accepted = greedy_verdicts(logits, [r.draft_token_ids for r in requests])  # the fast path
        else:
            draft_ids, num_drafted, draft_probs = self._pack(requests, logits.shape[1] - 1)
            sampling.token_masks = batch_masks([r.token_mask for r in requests], logits.shape[1], self.vocab_size)
            out = rejection_sample(logits, draft_ids, num_drafted, draft_probs, sampling)
            emitted, accepted = out.emitted(), out.num_accepted.tolist()
        results = []
        for i, (request, row_emitted, num_accepted) in enumerate(zip(requests, emitted, accepted)):
            self.runner.truncate(slots[i], old_lengths[i] + 1 + num_accepted)
            logprobs = None if request.logprobs is None else \
                emitted_logprobs(logits[i], request.sampling, row_emitted, request.logprobs, request.token_ids,
                                 request.num_prompt_tokens, request.token_mask)
            results.append(VerifyResult(request.seq_id, row_emitted, num_accepted, logprobs,
                                        self.runner.cached_tokens(slots[i]), prompt_logprobs[i]))
        return results

    def _sync(self, requests: list[VerifyRequest]) -> tuple[list[_TargetState], list, dict[int, list[int]]]:
        """Make every slot hold exactly history[:-1]: allocate, roll back, or prefill (batched).
        A new row whose history repeats an earlier new row's of this call (a request's n
        choices) gets a fork of that row's slot, sharing its blocks, instead of a prefill.
        A short catch-up (a prompt's next chunk) *rides* the verify forward instead, in front of
        its pending token, where it does not make that forward wider than its widest row: a
        forward of its own would cost another pass over the weights. Returns the states, each
        row's prompt logprobs (None where not asked) and the riding catch-ups by row (their
        slots are left short of history[:-1] by them)."""
        width = max(1 + len(r.draft_token_ids) for r in requests)  # the verify forward's longest row
        riding: dict[int, list[int]] = {}
        states: list[_TargetState | None] = []
        plain: dict[int, list[int]] = {}  # slot -> tokens to prefill (last logits only)
        scored: dict[int, tuple[int, VerifyRequest]] = {}  # slot -> (first position read, request)
        computes: dict[tuple[int, ...], int] = {}  # a history read whole by a new row -> its slot
        forks: list[tuple[int, int, int]] = []  # (row, source slot, length)
        for i, request in enumerate(requests):
            want, state = len(request.token_ids) - 1, self._states.get(request.seq_id)
            source = computes.get(tuple(request.token_ids[:want])) if state is None and want > 0 else None
            if source is not None and request.prompt_logprobs is None:
                forks.append((i, source, want))
                states.append(None)
                continue
            if state is None:
                state = self._states[request.seq_id] = _TargetState(self.runner.allocate_slot(request.reserve_tokens),
                                                                    request.reserve_tokens)
            start = self._rolled_back(request, state)
            if request.prompt_logprobs is not None:
                scored[state.slot] = (start, request)
            elif start < want and want - start + 1 + len(request.draft_token_ids) <= width:
                riding[i] = request.token_ids[start:want]  # filled by the verify forward: no fork source
            elif start < want:
                plain[state.slot] = request.token_ids[start:want]
            if start == 0 and want > 0 and i not in riding:
                computes.setdefault(tuple(request.token_ids[:want]), state.slot)
            states.append(state)
        if plain:
            self.runner.forward(list(plain), list(plain.values()), last_only=True)
        found = self._prompt_logprobs(scored)
        self._fork(requests, states, forks)
        return states, [found.get(state.slot) for state in states], riding

    def _rolled_back(self, request: VerifyRequest, state: _TargetState) -> int:
        """Roll ``state``'s slot back to where this call starts filling it, and return that position:
        the end of what it holds of history[:-1], or the first position the row's prompt logprobs read."""
        want, have = len(request.token_ids) - 1, self.runner.slot_length(state.slot)
        start = min(have, want if request.prompt_logprobs is None else max(request.prompt_logprobs_from - 1, 0))
        if have > start:
            self.runner.truncate(state.slot, start)
        return start

    def _fork(self, requests: list[VerifyRequest], states: list[_TargetState | None],
              forks: list[tuple[int, int, int]]) -> None:
        """Give each (row, source slot, length) of ``forks`` a fork of its source's slot, in ``states``; a fork
        may grow to what its source may."""
        reserves = {state.slot: state.reserve for state in self._states.values()}
        for i, source, length in forks:
            states[i] = self._states[requests[i].seq_id] = _TargetState(self.runner.fork_slot(source, length),
                                                                        reserves[source])

    def _prompt_logprobs(self, scored: dict[int, tuple[int, VerifyRequest]]) -> dict[int, list]:
        """Prefill the rows that want prompt logprobs from their first position read, with
        logits at every position; each row's logprobs of its history tokens from
        prompt_logprobs_from to the pending token (None for position 0), by slot."""
        rows = {slot: request.token_ids[start: len(request.token_ids) - 1] for slot, (start, request) in scored.items()}
        reading = [slot for slot, tokens in rows.items() if tokens]
        logits = self.runner.forward(reading, [rows[slot] for slot in reading]) if reading else None  # [B, T, V]
        found = {}
        for slot, (start, request) in scored.items():
            first, last = max(request.prompt_logprobs_from, 1), len(request.token_ids) - 1
            head = [None] if request.prompt_logprobs_from == 0 else []
            if first > last:
                found[slot] = head
                continue
            b = reading.index(slot)
            found[slot] = head + prompt_logprobs(logits[b, first - 1 - start: last - start],
                                                 request.token_ids[first: last + 1], request.prompt_logprobs)
        return found

    def _pack(self, requests: list[VerifyRequest], width: int):
        """Drafted tokens [batch, width] (-1 padded), num_drafted [batch], q [batch, width, vocab] | None.

        When some rows carry draft probabilities, rows without them get a one-hot q (never a
        zero q, which would accept anything): the one place that q is made up."""
        draft_ids = torch.full((len(requests), width), -1, dtype=torch.long)
        num_drafted = torch.tensor([len(r.draft_token_ids) for r in requests], dtype=torch.long)
        for i, r in enumerate(requests):
            draft_ids[i, : len(r.draft_token_ids)] = torch.tensor(r.draft_token_ids, dtype=torch.long)
        if all(r.draft_probs is None for r in requests):
            return draft_ids, num_drafted, None
        draft_probs = torch.zeros(len(requests), width, self.vocab_size)
        for i, r in enumerate(requests):
            n = len(r.draft_token_ids)
            if r.draft_probs is None:
                draft_probs[i, torch.arange(n), draft_ids[i, :n]] = 1.0
                continue
            draft_probs[i, :n] = r.draft_probs  # checked weights; normalised by the sampler
        return draft_ids, num_drafted, draft_probs

    def _checked(self, request: VerifyRequest) -> VerifyRequest:
        """The request with its q decoded (the only place encoded q is decoded, and drafts
        are checked), or without its drafts when they fail validation (its grammar mask then
        cut to the first position). ValueError when its mask does not fit its drafts."""
        self._check_mask(request)
        try:
            request = self._decoded(request)
            problem = self.draft_problem(request)
        except ValueError as exc:  # bytes that are no distributions (EncodedQ.decode)
            problem = f"q does not decode: {exc}"
        if problem is None:
            return request
        self.rejected_proposals += 1
        logger.warning("sequence %s: drafts not verified (%s); plain decoding this round", request.seq_id, problem)
        mask = None if request.token_mask is None else request.token_mask[:1]
        return dataclasses.replace(request, draft_token_ids=[], draft_probs=None, token_mask=mask)

    def _check_mask(self, request: VerifyRequest) -> None:
        """A grammar mask must cover every position verified ([num_drafted + 1, W] int32)."""
        mask, n = request.token_mask, len(request.draft_token_ids)
        if mask is None:
            return
        want = (n + 1, mask_width(self.vocab_size))
        if tuple(mask.shape) != want or mask.dtype != torch.int32:
            raise ValueError(f"sequence {request.seq_id}: token_mask must be int32 {list(want)}, "
                             f"got {mask.dtype} {list(mask.shape)}")

    def _decoded(self, request: VerifyRequest) -> VerifyRequest:
        """The request with q as [num_drafted, vocab] weights: encoded q decoded; dropped
        where the sampler does not read it (greedy rows, no drafts)."""
        q = request.draft_probs
        if q is None or isinstance(q, torch.Tensor):
            return request
        if request.sampling.is_greedy or not request.draft_token_ids:
            return dataclasses.replace(request, draft_probs=None)
        if len(q) != len(request.draft_token_ids):
            raise ValueError(f"{len(q)} distributions for {len(request.draft_token_ids)} drafted tokens")
        return dataclasses.replace(request, draft_probs=q.decode(self.vocab_size))  # [n, vocab]

    def draft_problem(self, request: VerifyRequest) -> str | None:
        """Why the request's drafts cannot be verified, or None when they can."""
        ids, n = request.draft_token_ids, len(request.draft_token_ids)
        if len(request.token_ids) + n > self.max_seq_len:
            return f"{n} drafted tokens do not fit the context after {len(request.token_ids)} tokens"
        if any(not 0 <= t < self.vocab_size for t in ids):
            return "a drafted token id lies outside the vocabulary"
        q = request.draft_probs
        if q is None or request.sampling.is_greedy or n == 0:
            return None
        return q_problem(q, ids, self.vocab_size)

    def release(self, seq_id: str) -> None:
        state = self._states.pop(seq_id, None)
        if state is not None:
            self.runner.free_slot(state.slot)


def _shifted(logits: torch.Tensor, offsets: list[int]) -> torch.Tensor:
    """Row b's logits from position offsets[b] on: [B, T, V] -> [B, T, V] (the tail past a row's
    end repeats its last position, never read)."""
    width = logits.shape[1]
    index = (torch.tensor(offsets)[:, None] + torch.arange(width)).clamp(max=width - 1)  # [B, T]
    return logits.gather(1, index.to(logits.device)[..., None].expand(-1, -1, logits.shape[2]))


def q_problem(q: torch.Tensor, ids: list[int], vocab_size: int) -> str | None:
    """Why q ([n, vocab] weights of the drafted tokens `ids`) is no valid draft distribution."""
    if tuple(q.shape) != (len(ids), vocab_size):
        return f"q must be [num_drafted={len(ids)}, vocab={vocab_size}], got {tuple(q.shape)}"
    q = q.double()
    if not bool(torch.isfinite(q).all()) or bool((q < 0).any()):
        return "q is not finite and non-negative"
    if bool(((q.sum(dim=-1) - 1.0).abs() > Q_SUM_TOLERANCE).any()):
        return f"q does not sum to 1 (within {Q_SUM_TOLERANCE})"
    if bool((q.gather(-1, torch.tensor(ids, dtype=torch.long)[:, None]) <= 0).any()):
        return "q gives a drafted token no probability"
    return None
