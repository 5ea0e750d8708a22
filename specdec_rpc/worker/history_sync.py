"""The history delta protocol of worker.proto: send each worker only what it has not seen.

The router owns every sequence's token history and is the source of truth. Per worker it
keeps a `HistorySender`, which remembers how many tokens of each history it has sent and
builds `HistoryDelta(offset, token_ids = history[offset:])` messages. The worker keeps a
`HistoryStore` that rebuilds the full histories from them:

* offset == known length: append (the usual round: the tokens emitted last round);
* offset <  known length: truncate to offset and append (the router resent part of it,
  or the history changed after offset: a draft's look-ahead history, which ends with
  drafts that the target may reject, is replaced from where it differs);
* offset >  known length, or offset > 0 for an unknown sequence (the worker restarted or
  lost a message): nothing is applied and the sequence goes into ``resync_seq_ids``; the
  router then resets its sent length to 0 and sends the whole history.

The sender remembers what it sent, so each delta starts where the new history first
differs from it. When a new history does not extend the old one, the sequence is reported
as *diverged*; the target (whose histories only grow, so this means a seq_id reused for
another sequence) drops its state for it before using it, while the draft's state follows
any history by itself.

A failed call leaves the router unsure what the worker applied, so it resets the sent
lengths of that call's sequences too (a whole history is always a correct delta).

Also here: the SamplingParams translation that every delta carries (doubles: exact). A
request's params do not change between its rounds, so each side translates them once: the
sender keeps each sequence's message, a worker's `SamplingDecoder` the params of the
messages it has seen (validated once).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from specdec.proposers.base import common_prefix_length
from specdec.sampling.grammar_matcher import Grammar
from specdec.sampling.sampling_params import SamplingParams
from specdec_rpc.v1 import worker_pb2


def sampling_to_proto(params: SamplingParams) -> worker_pb2.WorkerSamplingParams:
    """Core SamplingParams -> the workers' proto, exactly (doubles; top_p 1.0, seed None and
    repetition_penalty 1.0 are left unset)."""
    message = worker_pb2.WorkerSamplingParams(
        temperature=params.temperature, top_k=params.top_k, min_p=params.min_p,
        presence_penalty=params.presence_penalty, frequency_penalty=params.frequency_penalty,
        logit_bias=dict(params.logit_bias),
    )
    if params.top_p != 1.0:
        message.top_p = params.top_p
    if params.seed is not None:
        message.seed = params.seed
    if params.repetition_penalty != 1.0:
        message.repetition_penalty = params.repetition_penalty
    return message


def sampling_from_proto(message: worker_pb2.WorkerSamplingParams) -> SamplingParams:
    """Proto -> core SamplingParams (validated: bad values raise ValueError naming the field)."""
    return SamplingParams(
        temperature=message.temperature,
        top_k=message.top_k,
        top_p=message.top_p if message.HasField("top_p") else 1.0,
        seed=message.seed if message.HasField("seed") else None,
        min_p=message.min_p,
        presence_penalty=message.presence_penalty,
        frequency_penalty=message.frequency_penalty,
        repetition_penalty=message.repetition_penalty if message.HasField("repetition_penalty") else 1.0,
        logit_bias=dict(message.logit_bias),
    )


class SamplingDecoder:
    """Worker side: `sampling_from_proto` of each distinct message once (its params are
    validated once, not every round); keeps the `capacity` most recently used."""

    def __init__(self, capacity: int = 1024) -> None:
        self.capacity = capacity
        self._known: OrderedDict[bytes, SamplingParams] = OrderedDict()  # message bytes -> params

    def __call__(self, message: worker_pb2.WorkerSamplingParams) -> SamplingParams:
        """The params of `message` (ValueError, naming the field, for bad values: never kept)."""
        key = message.SerializeToString(deterministic=True)
        params = self._known.get(key)
        if params is None:
            params = self._known[key] = sampling_from_proto(message)
            if len(self._known) > self.capacity:
                self._known.popitem(last=False)
        else:
            self._known.move_to_end(key)
        return params


class HistorySender:
    """Router side, one per worker: how much of each sequence's history that worker has.

    namespace: prefixed to every seq_id on the wire, so that several routers (replicas,
    or a restarted one) that number their sequences alike never share a worker's state.
    """

    def __init__(self, namespace: str = "") -> None:
        self.namespace = namespace
        self._sent: dict[str, list[int]] = {}  # seq_id -> the history as last sent
        # seq_id -> (its params, their message): translated once per sequence, not every round
        self._sampling: dict[str, tuple[SamplingParams, worker_pb2.WorkerSamplingParams]] = {}
        self._grammars: set[str] = set()  # sequences whose grammar was sent since they were last forgotten

    def wire_id(self, seq_id: str) -> str:
        """The seq_id as the worker knows it."""
        return self.namespace + seq_id

    def local_id(self, wire_id: str) -> str:
        """The router's seq_id of a wire id (raises ValueError for ids of another namespace)."""
        if not wire_id.startswith(self.namespace):
            raise ValueError(f"seq_id {wire_id!r} is not in this router's namespace {self.namespace!r}")
        return wire_id[len(self.namespace) :]

    def __contains__(self, seq_id: str) -> bool:
        return seq_id in self._sent

    def __len__(self) -> int:
        return len(self._sent)

    def sent_length(self, seq_id: str) -> int:
        """Tokens of the history this worker is believed to hold (0 = none)."""
        return len(self._sent.get(seq_id, ()))

    def delta(self, seq_id: str, token_ids: Sequence[int], sampling: SamplingParams,
              num_prompt_tokens: int = 0, reserve_tokens: int | None = None,
              grammar: Grammar | None = None) -> worker_pb2.HistoryDelta:
        """The part of `token_ids` (the full history) from where it first differs from what
        was sent; records it as sent. num_prompt_tokens: how many leading tokens are the prompt;
        reserve_tokens: the cache the worker reserves for a sequence new to it (None: max_seq_len);
        grammar: the sequence's grammar, sent once (HistoryDelta.grammar) until it is forgotten."""
        token_ids = list(token_ids)
        offset = common_prefix_length(self._sent.get(seq_id, []), token_ids)
        self._sent[seq_id] = token_ids
        delta = worker_pb2.HistoryDelta(
            seq_id=self.wire_id(seq_id),
            offset=offset,
            token_ids=token_ids[offset:],
            sampling=self._sampling_message(seq_id, sampling),
            num_prompt_tokens=num_prompt_tokens,
            reserve_tokens=reserve_tokens or 0,
        )
        if grammar is not None and seq_id not in self._grammars:
            self._grammars.add(seq_id)
            delta.grammar.kind, delta.grammar.text = grammar.kind, grammar.text
        return delta

    def _sampling_message(self, seq_id: str, sampling: SamplingParams) -> worker_pb2.WorkerSamplingParams:
        """The sequence's params as a message, translated again only when they changed (the
        delta copies it: the kept one is never handed out to be changed)."""
        kept = self._sampling.get(seq_id)
        if kept is None or (kept[0] is not sampling and kept[0] != sampling):
            kept = self._sampling[seq_id] = (sampling, sampling_to_proto(sampling))
        return kept[1]

    def clear(self) -> None:
        """Forget everything sent (a new, empty worker): every next delta is a whole history."""
        self._sent.clear()
        self._sampling.clear()
        self._grammars.clear()

    def reset(self, seq_ids: Iterable[str]) -> None:
        """Forget what was sent (resync, failed call, released): the next delta is the whole history."""
        for seq_id in seq_ids:
            self._sent.pop(seq_id, None)
            self._sampling.pop(seq_id, None)
            self._grammars.discard(seq_id)


@dataclass
class AppliedDeltas:
    """The outcome of one call's deltas, in call order.

    histories: the full history per delta (None = needs a resync, nothing applied).
    resync_seq_ids: the sequences to report in resync_seq_ids.
    diverged_seq_ids: known sequences whose new history does not extend the old one. For
        the target (whose histories only grow) that is a reused seq_id: its cache slot is
        stale and must be dropped before use; the draft follows any history by itself.
    """

    histories: list[list[int] | None] = field(default_factory=list)
    resync_seq_ids: list[str] = field(default_factory=list)
    diverged_seq_ids: list[str] = field(default_factory=list)

    def applied_seq_ids(self, deltas: Iterable[worker_pb2.HistoryDelta]) -> list[str]:
        """The seq_ids of the call's deltas (same order) that were applied (not resyncs)."""
        return [delta.seq_id for delta, history in zip(deltas, self.histories) if history is not None]


class HistoryStore:
    """Worker side: the full histories rebuilt from deltas."""

    def __init__(self) -> None:
        self._histories: dict[str, list[int]] = {}

    def __contains__(self, seq_id: str) -> bool:
        return seq_id in self._histories

    def __len__(self) -> int:
        return len(self._histories)

    def history(self, seq_id: str) -> list[int]:
        return self._histories[seq_id]

    def apply(self, delta: worker_pb2.HistoryDelta) -> list[int] | None:
        """Apply one delta; returns the full history, or None when the sequence needs a resync.

        Never mutates a history in place (a running call may still read the old list)."""
        known = self._histories.get(delta.seq_id)
        if delta.offset > (0 if known is None else len(known)):
            return None
        if known is None or delta.offset == 0:
            history = list(delta.token_ids)
        else:
            history = known[: delta.offset] + list(delta.token_ids)
        if not history:
            raise ValueError(f"sequence {delta.seq_id!r}: empty history (need at least the pending token)")
        self._histories[delta.seq_id] = history
        return history

    def apply_all(self, deltas: Iterable[worker_pb2.HistoryDelta]) -> AppliedDeltas:
        """Apply a call's deltas (each seq_id at most once)."""
        applied = AppliedDeltas()
        seen: set[str] = set()
        for delta in deltas:
            if not delta.seq_id:
                raise ValueError("history delta without a seq_id")
            if delta.seq_id in seen:
                raise ValueError(f"sequence {delta.seq_id!r} appears twice in one call")
            seen.add(delta.seq_id)
            known = self._histories.get(delta.seq_id)
            history = self.apply(delta)
            applied.histories.append(history)
            if history is None:
                applied.resync_seq_ids.append(delta.seq_id)
            elif known is not None and delta.offset < len(known) and _rewrites(known, delta):
                applied.diverged_seq_ids.append(delta.seq_id)
        return applied

    def release(self, seq_id: str) -> None:
        """Forget a sequence (unknown ids are ignored)."""
        self._histories.pop(seq_id, None)


def _rewrites(known: list[int], delta: worker_pb2.HistoryDelta) -> bool:
    """Whether a delta from inside `known` (offset < len(known)) changes or drops any of its
    tokens, i.e. the new history does not extend it (a delta at its end always does: the
    usual round compares nothing)."""
    kept = len(known) - delta.offset
    return list(delta.token_ids[:kept]) != known[delta.offset:]
