"""Draft-model proposer: a small model with its own slot cache guesses γ tokens per sequence.

The proposer is history-driven: per sequence it remembers which tokens its cache holds.
Each round it rolls the cache back (O(1)) to the longest prefix it shares with the new
history —
the accepted drafted tokens survive, the rejected ones are forgotten — feeds the tokens it
has not seen (usually the recovered/bonus token; many after speculation was off or after a
restart) and then drafts each row's own γ, feeding all but its last guess back. There is
no separate "commit" step, so a proposer that missed rounds simply catches up.

Isolation: every row drafts exactly its own γ, clipped to what fits its context (down to
0). All rows are checked before any state changes; if the forward pass fails, the rows of
that call are forgotten (their slots freed), so the next call rebuilds them from history.

Drafting ahead (`look_ahead`, while the target verifies a round): the draft ranks its own
tokens at every drafted position and drafts the next round for several verdicts of this one
(all accepted; a rejection at d1, d2, ... with its next-best token), each on a slot forked
from the sequence's own (see `look_ahead`).

Under a grammar (structured output) a row drafts under the target's mask: each position's
logits are masked by the grammar state after the history and the row's drafts before it (a
copy of the row's matcher, `ProposalRequest.grammar`), and q is that masked, renormalised
distribution, the one the draft drew from.

Seeded sampled requests are coupled (specdec.sampling.gumbel_sampling): the draft's guess at a
position is its Gumbel-max choice under the noise the target uses there, which
`sample_from_probs` draws for such rows; the look-ahead ranks by the same race.
"""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass, field

import torch

from specdec.sampling.counter_rng import ROLE_DRAFT
from specdec.sampling.grammar_cursor import mask_logits
from specdec.sampling.gumbel_sampling import race
from specdec.models.decode_steps import DecodeSteps, decode_steps
from specdec.models.model_runner import ModelRunner
from specdec.proposers.base import Branch, Drafts, Proposal, ProposalRequest, Proposer, common_prefix_length
from specdec.sampling.sampling import SamplingBatch, logits_to_probs, sample_from_probs


@dataclass
class _DraftState:
    slot: int
    cached: list[int] = field(default_factory=list)  # tokens held by the slot, in order
    reserve: int = 0  # the tokens its cache may grow to, as last granted (0: max_seq_len)


class DraftModelProposer(Proposer):
    """Proposes by running the draft model autoregressively, batched over sequences."""

    has_probs = True
    names = ("draft",)

    def __init__(self, runner: ModelRunner, vocab_size: int, wire_dtype: torch.dtype | None = None) -> None:
        """vocab_size: the target's vocabulary rows; q is cut or padded to it (padding rows
        that differ between two models carry no probability).
        wire_dtype: when q travels compactly (float16 over gRPC), it is rounded to that
        dtype *before* sampling, so the token is drawn from exactly the q the target will
        see (default float32, the dtype of Drafts.q)."""
        self.runner = runner
        self.vocab_size = vocab_size
        self.wire_dtype = wire_dtype
        self._q_dtype = wire_dtype or torch.float32
        self._states: dict[str, _DraftState] = {}
        self._forks = 0  # slots a look-ahead in progress holds for its branches
        self._forks_lock = threading.Lock()  # num_free_slots may be read from another thread

    @property
    def num_free_slots(self) -> int:
        """Slots free for sequences: a look-ahead's forks (held only while it runs) count as
        free. Safe to read from another thread while a look-ahead runs."""
        with self._forks_lock:
            return self.runner.num_free_slots + self._forks

    def _fit_vocab(self, logits: torch.Tensor) -> torch.Tensor:
        # [batch, draft_vocab] -> [batch, vocab_size]
        extra = self.vocab_size - logits.shape[-1]
        if extra == 0:  # the same vocabulary (the usual pair): no copy
            return logits
        if extra < 0:
            return logits[:, : self.vocab_size]
        return torch.nn.functional.pad(logits, (0, extra), value=float("-inf"))

    def fitting_gamma(self, request: ProposalRequest) -> int:
        """The request's γ clipped to the draft's context: the history and all but the last
        guess must fit one slot, within the request's reserve (0 = this row cannot draft now)."""
        room = min(self.runner.max_seq_len, request.reserve_tokens or self.runner.max_seq_len)
        return max(0, min(request.gamma, room - len(request.token_ids) + 1))

    def _plan(self, requests: list[ProposalRequest]) -> list[int]:
        """Each row's γ for this call, checked before anything changes: clipped to the
        context, and 0 for new sequences beyond what the cache can reserve (in order)."""
        gammas = [self.fitting_gamma(request) for request in requests]
        self._grow(requests, gammas)
        new = [i for i, (request, gamma) in enumerate(zip(requests, gammas))
               if gamma and request.seq_id not in self._states]
        admitted = self.runner.admits([requests[i].reserve_tokens for i in new]) if new else 0  # a pass over the cache
        for i in new[admitted:]:
            gammas[i] = 0
        return gammas

    def _grow(self, requests: list[ProposalRequest], gammas: list[int]) -> None:
        """Held rows whose reserve grew (the engine grants cache as a sequence grows) raise it in
        the draft's cache, in order; the rows it cannot cover draft nothing and free their
        blocks for the ones before them (read again when there is room: speed, never output)."""
        grow, states = getattr(self.runner, "grow_reserves", None), self._states
        held = [i for i, (request, gamma) in enumerate(zip(requests, gammas))
                if gamma and request.seq_id in states and states[request.seq_id].reserve
                and (request.reserve_tokens or 0) > states[request.seq_id].reserve]  # only a grown reserve
        if grow is None or not held:
            return
        grown = grow([(states[requests[i].seq_id].slot, requests[i].reserve_tokens) for i in held])
        for i in held[:grown]:
            states[requests[i].seq_id].reserve = requests[i].reserve_tokens
        for i in held[grown:]:
            gammas[i] = 0
            self.release(requests[i].seq_id)

    def propose(self, requests: list[ProposalRequest]) -> Proposal:
        gammas = self._plan(requests)
        proposal = [Drafts() for _ in requests]
        rows = [i for i, g in enumerate(gammas) if g > 0]
        if not rows:
            return proposal
        part = [requests[i] for i in rows]
        try:
            tokens, probs = self._draft(part, [gammas[i] for i in rows])
        except BaseException:
            for request in part:  # unknown cache contents: rebuild these rows next time
                self.release(request.seq_id)
            raise
        for j, i in enumerate(rows):
            proposal[i] = self._drafts(tokens[j], probs, j, gammas[i], requests[i])
        return proposal

    @staticmethod
    def _drafts(tokens: list[int], probs: torch.Tensor | None, j: int, n: int,
                request: ProposalRequest) -> Drafts:
        """Row j of a _draft call (its tokens), n tokens long; greedy rows carry no q (a
        one-hot q is what the verifier assumes without one)."""
        q = None if probs is None or request.sampling.is_greedy else probs[j, :n]  # [n, vocab]
        return Drafts(tokens[:n], q)

    def look_ahead(self, requests: list[ProposalRequest], unverified: list[int],
                   branches: int = 1) -> list[list[Branch]]:
        """Drafts for the first `branches` verdicts of each round being verified (see Proposer).

        One forward feeds the round's drafts and ranks the draft's tokens at every drafted
        position and after the last. The verdicts, in this order: every draft accepted and
        the draft's best bonus token (the plain look-ahead); a rejection at the 1st, 2nd, ...
        draft with the draft's best other token there; the second-best bonus token; then the
        same with the next-best tokens. (Ranking verdicts by the draft's own probabilities
        instead made fewer look-aheads usable: its q is far less confident than its greedy
        agreement with the target.) Each chosen verdict's history is drafted, all of them in
        one batched pass, exactly as `propose` would draft from it (same random draws): the
        first continues the sequence's own slot, every other one a slot forked from it at its
        prefix. Forks beyond the free slots are dropped, last verdicts first."""
        found: list[list[Branch]] = [[] for _ in requests]
        rows = [i for i, r in enumerate(requests) if r.gamma > 0 and r.seq_id in self._states
                and 0 <= unverified[i] < len(r.token_ids) <= self.runner.max_seq_len]
        if not rows or branches <= 0:
            return found
        try:
            points = self._verdicts(rows, requests, unverified, branches)  # (rank, row, base, token)
            forked = [p for p in points if p[0] > 0][: self.runner.num_free_slots]  # rank 0 continues its own slot
            points = [p for p in points if p[0] == 0] + forked
            asks = [dataclasses.replace(requests[i], token_ids=[*requests[i].token_ids[:base], token])
                    for _, i, base, token in points]
            tokens, probs = self._draft_branches(asks, [p[0] == 0 for p in points]) if asks else (None, None)
        except BaseException:
            for i in rows:  # unknown cache contents: rebuild these rows next time
                self.release(requests[i].seq_id)
            raise
        for j, ((_, i, base, token), ask) in enumerate(zip(points, asks)):
            n = self.fitting_gamma(ask)
            drafts = self._drafts(tokens[j], probs, j, n, ask)
            found[i].append(Branch(base, token, drafts.token_ids, drafts.q))
        return found

    def _verdicts(self, rows: list[int], requests: list[ProposalRequest], unverified: list[int],
                  branches: int) -> list[tuple[int, int, int, int]]:
        """Feed the given rows' unverified drafts (after rolling back to the history they
        confirm) and rank the draft's tokens at every drafted position and after the last.
        Returns each row's first `branches` verdicts (look_ahead's order) as (rank, row, kept
        history length, token), rank 0 first, for verdicts whose history still fits."""
        states = [self._states[requests[i].seq_id] for i in rows]
        chunks = []
        for i, state in zip(rows, states):
            history = requests[i].token_ids
            keep = min(common_prefix_length(state.cached, history), len(history) - unverified[i] - 1)
            self.runner.truncate(state.slot, keep)
            del state.cached[keep:]
            chunks.append(history[keep:])
            state.cached.extend(history[keep:])
        logits = self.runner.forward([s.slot for s in states], chunks, last_only=False)  # [n, T, draft vocab]
        points = []
        for k, (i, chunk) in enumerate(zip(rows, chunks)):
            u, history = unverified[i], requests[i].token_ids
            ranked = self._ranked(self._fit_vocab(logits[k, len(chunk) - u - 1 : len(chunk)]), requests[i])
            order = ranked.topk(min(branches + 1, ranked.shape[-1]), dim=-1).indices.tolist()  # [u + 1, branches + 1]
            start, row = len(history) - u, []  # the round's history length
            for j, best in enumerate(order):
                drafted = history[start + j] if j < u else None
                others = [t for t in best if t != drafted]
                row += [(rank + (j < u), j, i, start + j, t) for rank, t in enumerate(others)
                        if start + j < self.runner.max_seq_len]
            points += [(rank, i, base, t) for rank, _, i, base, t in sorted(row)[:branches]]
        return sorted(points, key=lambda point: point[0])

    def _ranked(self, logits: torch.Tensor, request: ProposalRequest) -> torch.Tensor:
        """Scores ranking the draft's tokens, logits [u + 1, vocab] -> [u + 1, vocab]: row j
        for the token at history position len(history) - u + j (the u unverified drafts' and
        the one after). The logits, or for a coupled row (a seeded sampled request) its Gumbel
        race over q, the order in which the target's coupled choice is likeliest to fall
        (specdec.sampling.gumbel_sampling)."""
        n = logits.shape[0]
        first = len(request.token_ids) - (n - 1)
        history = request.token_ids
        batch = SamplingBatch.from_params([request.sampling] * n, [first + j for j in range(n)],
                                          histories=[history[: first + j] for j in range(n)],
                                          num_prompt_tokens=[request.num_prompt_tokens] * n)
        logits = batch.processed(logits[:, None])[:, 0]  # row j sees the history before its position
        cursor = request.grammar.at(history[:first]) if request.grammar else None
        if cursor is not None:  # under a grammar: the tokens it allows rank first, as only they can come
            logits = mask_logits(logits, cursor.masks_along(history[first:]))
        if not bool(batch.coupled.all()):
            return logits
        q = logits_to_probs(logits, batch).to(self._q_dtype)  # [u + 1, vocab], as drafted
        return race(q, batch.seeds, batch.positions)

    def _draft_branches(self, asks: list[ProposalRequest], own: list[bool]):
        """Draft each ask: on its sequence's own slot where `own` (the slot holds all of the
        ask's history but its last token), else on a slot forked from it at that history
        (freed afterwards). Returns _draft's (tokens, q)."""
        forks, states = [], []
        try:
            for ask, on_own in zip(asks, own):
                state = self._states[ask.seq_id]
                if not on_own:
                    base = len(ask.token_ids) - 1
                    with self._forks_lock:
                        state = _DraftState(self.runner.fork_slot(state.slot, base), ask.token_ids[:-1])
                        self._forks += 1
                    forks.append(state)
                states.append(state)
            return self._draft(asks, [self.fitting_gamma(ask) for ask in asks], states)
        finally:
            for fork in forks:
                with self._forks_lock:
                    self.runner.free_slot(fork.slot)
                    self._forks -= 1

    def _draft(self, requests: list[ProposalRequest], gammas: list[int], states: list[_DraftState] | None = None):
        """Draft gammas[j] tokens for row j (on the given cache states; default: each
        sequence's own). Returns the tokens, one list per row (gammas[j] long), and q weights
        [n, max γ, vocab] (zeros past a row's γ), or None when every row is greedy."""
        states = states if states is not None else [self._claim(r) for r in requests]
        batch = SamplingBatch.from_params([r.sampling for r in requests], [len(r.token_ids) for r in requests],
                                          histories=[r.token_ids for r in requests],
                                          num_prompt_tokens=[r.num_prompt_tokens for r in requests])
        # the steps feed all but the last guess: gammas[j] - 1 tokens for row j, inputs built once
        logits, steps = self._catch_up(requests, states, [max(g - 1, 0) for g in gammas])  # [n, vocab]
        if batch.all_greedy and batch.processing is None and all(r.grammar is None for r in requests):
            return self._greedy_steps(logits, gammas, states, steps), None
        cursors = [None if r.grammar is None else r.grammar.at(r.token_ids) for r in requests]  # copies to walk
        guessed: list[list[int]] = [[] for _ in requests]  # each row's guesses so far
        probs = None if batch.all_greedy else torch.zeros(len(requests), max(gammas), self.vocab_size)
        active = list(range(len(requests)))
        for i in range(max(gammas)):
            # every row still drafting (the usual case), or greedy rows without processing, which
            # read nothing of the batch but its processing: the whole batch, no sub-batch to build
            whole = len(active) == len(requests) or (probs is None and batch.processing is None)
            rows = slice(None) if whole else torch.tensor(active, dtype=torch.long)
            sub = batch.select(rows)
            if sub.processing is not None:  # the guesses before i seen, as the target will
                logits = sub.processed_after(logits, torch.tensor([guessed[row] for row in active], dtype=torch.long))
            # under a grammar, its mask after the history and the guesses before i (the target's)
            logits = mask_logits(logits, [cursors[row] and cursors[row].allowed() for row in active])
            token, weights = self._sample(logits, sub, i, probs is not None)  # [a], [a, vocab]
            if probs is not None:
                probs[rows, i] = weights
            guesses = token.tolist()  # [a]: one read of the step's tokens, not one per row
            for row, guess in zip(active, guesses):
                guessed[row].append(guess)
                if cursors[row] is not None:
                    cursors[row].accept(guess)
            fed = self._feed(active, guesses, gammas, i, states, steps)
            if fed is None:
                break
            active, logits = fed
        return guessed, probs

    def _greedy_steps(self, logits: torch.Tensor, gammas: list[int], states: list[_DraftState],
                      steps: DecodeSteps) -> list[list[int]]:
        """_draft's steps for greedy rows without processing or grammar (the usual batch): each
        step one argmax and one read of its tokens, fed back; no sub-batch, mask or q to build
        (the same guesses as the general loop, which reads nothing else for such rows)."""
        guessed: list[list[int]] = [[] for _ in gammas]
        active = list(range(len(gammas)))
        for i in range(max(gammas)):
            guesses = logits.argmax(dim=-1).tolist()  # [a]
            for row, guess in zip(active, guesses):
                guessed[row].append(guess)
            fed = self._feed(active, guesses, gammas, i, states, steps)
            if fed is None:
                break
            active, logits = fed
        return guessed

    def _feed(self, active: list[int], guesses: list[int], gammas: list[int], step: int,
              states: list[_DraftState], steps: DecodeSteps) -> tuple[list[int], torch.Tensor] | None:
        """Feed step `step`'s guesses of the rows that draft past it (guesses[k]: row active[k]'s)
        through the draft: -> those rows and their next logits [a, vocab]; None when no row
        drafts on (the steps end)."""
        fed = [k for k, row in enumerate(active) if gammas[row] > step + 1]
        if not fed:
            return None
        rows, tokens = [active[k] for k in fed], [guesses[k] for k in fed]
        logits = self._fit_vocab(steps.forward(tokens, rows))
        for row, token in zip(rows, tokens):
            states[row].cached.append(token)
        return rows, logits

    def _sample(self, logits: torch.Tensor, batch: SamplingBatch, offset: int, need_q: bool):
        """The guesses at history position positions + offset: logits [a, vocab] -> tokens
        [a] and, when need_q, the q weights they were drawn from (rounded to the wire dtype
        first; one-hot for greedy rows)."""
        if not need_q:
            return logits.argmax(dim=-1), None
        weights = logits_to_probs(logits, batch).to(self._q_dtype)  # [a, vocab]
        return sample_from_probs(weights, batch, offset, ROLE_DRAFT), weights.float()

    def _claim(self, request: ProposalRequest) -> _DraftState:
        state = self._states.get(request.seq_id)
        if state is None:
            slot = self.runner.allocate_slot(request.reserve_tokens)
            state = self._states[request.seq_id] = _DraftState(slot, reserve=request.reserve_tokens or 0)
        return state

    def _catch_up(self, requests: list[ProposalRequest], states: list[_DraftState],
                  steps_after: list[int]) -> tuple[torch.Tensor, DecodeSteps]:
        """Roll each cache back to what the history confirms and feed the rest of the history.
        Returns next-token logits [batch, vocab] and the decode steps after it (row j's
        steps_after[j] one-token forwards). Where every row catches up on one token (the
        pending one, after a rejection: most rounds) that token is the steps' first, not a
        forward of its own: the same logits, without a forward's checks and input tensors.
        The caller checked that every history fits."""
        chunks = []
        for request, state in zip(requests, states):
            history = request.token_ids  # any history: it may roll back (drafting ahead)
            # the pending token (history[-1]) is always fed, so it is never kept
            keep = common_prefix_length(state.cached, history[:-1])
            self.runner.truncate(state.slot, keep)
            del state.cached[keep:]
            chunks.append(history[keep:])
            state.cached.extend(history[keep:])
        slots = [s.slot for s in states]
        if all(len(chunk) == 1 for chunk in chunks):
            steps = decode_steps(self.runner, slots, [1 + n for n in steps_after])
            logits = steps.forward([chunk[0] for chunk in chunks])
        else:
            logits = self.runner.forward(slots, chunks, last_only=True)
            steps = decode_steps(self.runner, slots, steps_after)
        return self._fit_vocab(logits), steps

    def release(self, seq_id: str) -> None:
        state = self._states.pop(seq_id, None)
        if state is not None:
            self.runner.free_slot(state.slot)
