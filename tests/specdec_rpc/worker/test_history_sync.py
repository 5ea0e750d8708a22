"""The delta protocol: the router sends only what a worker has not seen; workers rebuild whole histories."""

from __future__ import annotations

import pytest

from specdec.requests.grammar_spec import GrammarSpec
from specdec.sampling.sampling_params import SamplingParams
from specdec_rpc.worker.history_sync import (HistorySender, HistoryStore, SamplingDecoder, sampling_from_proto,
                                             sampling_to_proto)
from specdec_rpc.v1 import worker_pb2

GREEDY = SamplingParams()


def delta(seq_id: str, offset: int, tokens: list[int]) -> worker_pb2.HistoryDelta:
    return worker_pb2.HistoryDelta(seq_id=seq_id, offset=offset, token_ids=tokens)


def test_the_first_delta_is_the_whole_history_then_only_the_new_tokens():
    sender = HistorySender()
    first = sender.delta("a", [1, 2, 3], GREEDY)
    assert (first.offset, list(first.token_ids)) == (0, [1, 2, 3])
    second = sender.delta("a", [1, 2, 3, 4, 5], GREEDY)
    assert (second.offset, list(second.token_ids)) == (3, [4, 5])
    assert sender.sent_length("a") == 5 and "a" in sender and len(sender) == 1


def test_a_grammar_rides_on_the_first_delta_that_has_one_and_again_after_the_sequence_is_forgotten():
    sender, schema = HistorySender(), GrammarSpec("json_object")
    read = sender.delta("a", [1, 2], GREEDY)  # a prefill chunk's read carries none
    first = sender.delta("a", [1, 2, 3], GREEDY, grammar=schema)
    later = sender.delta("a", [1, 2, 3, 4], GREEDY, grammar=schema)
    assert not read.HasField("grammar") and not later.HasField("grammar")
    assert (first.grammar.kind, first.grammar.text) == ("json_object", "")
    sender.reset(["a"])  # resync, failed call, released: the worker may hold none of it
    assert sender.delta("a", [1, 2, 3, 4], GREEDY, grammar=schema).HasField("grammar")


def test_a_namespace_prefixes_every_seq_id_on_the_wire():
    sender = HistorySender(namespace="router-a/")
    assert sender.delta("seq-0", [1], GREEDY).seq_id == "router-a/seq-0"
    assert sender.local_id("router-a/seq-0") == "seq-0" and sender.sent_length("seq-0") == 1
    with pytest.raises(ValueError, match="namespace"):
        sender.local_id("router-b/seq-0")


def test_reset_makes_the_next_delta_the_whole_history():
    sender = HistorySender()
    sender.delta("a", [1, 2], GREEDY)
    sender.delta("b", [7], GREEDY)
    sender.reset(["a", "unknown"])
    assert sender.delta("a", [1, 2, 3], GREEDY).offset == 0
    assert sender.delta("b", [7, 8], GREEDY).offset == 1


def test_a_changed_history_is_sent_from_where_it_first_differs():
    """A draft's look-ahead history ends with drafts the target may reject: the next
    history replaces it from the first difference, and the store rebuilds it exactly."""
    sender, store = HistorySender(), HistoryStore()
    store.apply(sender.delta("a", [1, 2, 3, 4], GREEDY))
    rolled_back = sender.delta("a", [1, 2, 9], GREEDY)
    assert (rolled_back.offset, list(rolled_back.token_ids)) == (2, [9])
    assert store.apply(rolled_back) == [1, 2, 9]
    shorter = sender.delta("a", [1, 2], GREEDY)
    assert (shorter.offset, list(shorter.token_ids)) == (2, [])
    assert store.apply(shorter) == [1, 2]


def test_every_delta_carries_the_sampling_params():
    sampling = SamplingParams(temperature=0.5, top_k=3, top_p=0.75, seed=11)
    message = HistorySender().delta("a", [1], sampling).sampling
    assert sampling_from_proto(message) == sampling


@pytest.mark.parametrize("sampling", [
    SamplingParams(temperature=1e-300, seed=1), SamplingParams(temperature=1e39), SamplingParams(temperature=1e300),
    SamplingParams(temperature=1.0, top_p=1e-50), SamplingParams(temperature=1.0, top_p=5e-324),
    SamplingParams(temperature=0.7, top_p=1 - 2**-40, top_k=2**31 - 1, seed=2**64 - 1),
])
def test_sampling_params_reach_the_workers_at_full_precision(sampling):
    """What the router validated is what a worker samples with: nothing rounds to float32
    (1e-300 would become greedy, 1e39 infinity, top_p just below 1 no filter at all)."""
    wire = HistorySender().delta("a", [1], sampling).SerializeToString()
    assert sampling_from_proto(worker_pb2.HistoryDelta.FromString(wire).sampling) == sampling


def test_penalties_bias_min_p_and_the_prompt_length_reach_the_workers():
    """Both workers process each position like the router's request asked: the processing
    params at full precision, and where the prompt ends (penalties count the output only)."""
    sampling = SamplingParams(temperature=0.8, min_p=1e-7, presence_penalty=-1.75, frequency_penalty=0.3,
                              repetition_penalty=1.0 + 2**-40, logit_bias={3: -100.0, 2**31 - 1: 0.125})
    wire = HistorySender().delta("a", [1, 2, 3], sampling, num_prompt_tokens=2).SerializeToString()
    message = worker_pb2.HistoryDelta.FromString(wire)
    assert sampling_from_proto(message.sampling) == sampling and message.num_prompt_tokens == 2
    with pytest.raises(ValueError, match="logit_bias"):
        sampling_from_proto(worker_pb2.WorkerSamplingParams(logit_bias={5: 1000.0}))


def test_sampling_defaults_stay_unset_on_the_wire_and_come_back():
    message = sampling_to_proto(GREEDY)
    assert not message.HasField("top_p") and not message.HasField("seed") and not message.HasField("repetition_penalty")
    assert sampling_from_proto(message) == GREEDY
    assert sampling_from_proto(worker_pb2.WorkerSamplingParams(seed=0)).seed == 0


def test_bad_sampling_values_fail_naming_the_field():
    with pytest.raises(ValueError, match="temperature"):
        sampling_from_proto(worker_pb2.WorkerSamplingParams(temperature=-1))
    with pytest.raises(ValueError, match="top_p"):
        sampling_from_proto(worker_pb2.WorkerSamplingParams(top_p=0))


def test_the_store_rebuilds_histories_from_deltas():
    store = HistoryStore()
    assert store.apply(delta("a", 0, [1, 2, 3])) == [1, 2, 3]
    assert store.apply(delta("a", 3, [4])) == [1, 2, 3, 4]
    assert store.apply(delta("a", 4, [])) == [1, 2, 3, 4]  # nothing new
    assert store.history("a") == [1, 2, 3, 4]


def test_a_delta_below_the_known_length_truncates_and_replaces():
    store = HistoryStore()
    store.apply(delta("a", 0, [1, 2, 3, 4]))
    assert store.apply(delta("a", 2, [9])) == [1, 2, 9]
    assert store.apply(delta("a", 0, [5, 6])) == [5, 6]


def test_unknown_sequences_and_gaps_ask_for_a_resync_and_change_nothing():
    store = HistoryStore()
    store.apply(delta("a", 0, [1, 2]))
    applied = store.apply_all([delta("new", 0, [5]), delta("lost", 3, [4]), delta("a", 5, [9])])
    assert applied.histories == [[5], None, None] and applied.resync_seq_ids == ["lost", "a"]
    assert store.history("a") == [1, 2] and "lost" not in store


def test_the_round_trip_sender_to_store_after_a_worker_restart():
    sender, store = HistorySender(), HistoryStore()
    history = [1, 2, 3]
    assert store.apply(sender.delta("a", history, GREEDY)) == history
    history += [4, 5]
    store = HistoryStore()  # the worker restarted
    resync = store.apply_all([sender.delta("a", history, GREEDY)]).resync_seq_ids
    assert resync == ["a"]
    sender.reset(resync)
    assert store.apply(sender.delta("a", history, GREEDY)) == [1, 2, 3, 4, 5]


def test_a_replaced_history_that_does_not_extend_the_old_one_is_reported_as_diverged():
    store = HistoryStore()
    store.apply_all([delta(s, 0, [1, 2, 3]) for s in ("resent", "changed", "shorter", "appended", "same")])
    applied = store.apply_all([delta("resent", 0, [1, 2, 3, 4]), delta("changed", 1, [7]), delta("shorter", 0, [1]),
                               delta("appended", 3, [4]), delta("same", 2, [3])])
    assert applied.histories == [[1, 2, 3, 4], [1, 7], [1], [1, 2, 3, 4], [1, 2, 3]]
    assert applied.diverged_seq_ids == ["changed", "shorter"] and applied.resync_seq_ids == []


def test_release_forgets_a_sequence():
    store = HistoryStore()
    store.apply(delta("a", 0, [1]))
    store.release("a")
    store.release("never-seen")
    assert "a" not in store and len(store) == 0


@pytest.mark.parametrize(
    "deltas, match",
    [
        ([delta("a", 0, [])], "empty history"),
        ([delta("a", 0, [1]), delta("a", 1, [2])], "twice"),
        ([delta("", 0, [1])], "seq_id"),
    ],
)
def test_malformed_calls_fail_clearly(deltas, match):
    with pytest.raises(ValueError, match=match):
        HistoryStore().apply_all(deltas)


def test_a_sequence_whose_params_change_sends_the_new_ones():
    """The sender translates a sequence's params once, but never sends stale ones."""
    sender, first, second = HistorySender(), SamplingParams(temperature=0.5, seed=1), SamplingParams(temperature=0.9)
    assert sampling_from_proto(sender.delta("a", [1], first).sampling) == first
    assert sampling_from_proto(sender.delta("a", [1, 2], first).sampling) == first
    assert sampling_from_proto(sender.delta("a", [1, 2, 3], second).sampling) == second
    sender.reset(["a"])
    assert sampling_from_proto(sender.delta("a", [1, 2, 3], first).sampling) == first


def test_the_workers_decoder_validates_each_message_once_and_refuses_bad_ones_every_time():
    decode = SamplingDecoder(capacity=2)
    sampled = sampling_to_proto(SamplingParams(temperature=0.7, top_k=5, logit_bias={3: 1.5}))
    assert decode(sampled) == sampling_from_proto(sampled) and decode(sampled) is decode(sampled)
    for _ in range(2):
        with pytest.raises(ValueError, match="temperature"):
            decode(worker_pb2.WorkerSamplingParams(temperature=-1))
    assert decode(sampling_to_proto(GREEDY)) == GREEDY
    assert decode(sampling_to_proto(SamplingParams(temperature=2.0))).temperature == 2.0  # evicts the oldest
    assert decode(sampled) == sampling_from_proto(sampled)  # decoded again after eviction
