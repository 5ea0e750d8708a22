"""The q codec moves float16-exact weights bit-exactly, in whichever form (dense / sparse) is smaller."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specdec.sampling.sampling import SamplingBatch, logits_to_probs, normalize_probs
from specdec.sampling.sampling_params import SamplingParams
from specdec_rpc.worker.prob_codec import (
    WireQ, decode_distribution, decode_rows, encode_distribution, encode_rows, varint_size, wire_q,
)
from specdec_rpc.v1 import worker_pb2

VOCAB = 4096


def wire_weights(params: SamplingParams, rows: int = 3, vocab: int = VOCAB, seed: int = 0) -> torch.Tensor:
    """[rows, vocab] processed probabilities rounded to float16, as DraftModelProposer(wire_dtype=fp16) sends them."""
    logits = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * 3
    probs = logits_to_probs(logits, SamplingBatch.from_params([params] * rows))
    return probs.half().float()


def assert_bit_exact(a: torch.Tensor, b: torch.Tensor) -> None:
    assert a.dtype == b.dtype == torch.float32 and a.shape == b.shape
    assert torch.equal(a.view(torch.int32), b.view(torch.int32))


def test_a_full_softmax_row_travels_dense_and_comes_back_bit_exact():
    weights = wire_weights(SamplingParams(temperature=1.0))
    for row in weights:
        message = encode_distribution(row)
        assert not message.sparse_ids and len(message.dense_f16) == 2 * VOCAB
        assert_bit_exact(decode_distribution(message, VOCAB), row)


@pytest.mark.parametrize(
    "params", [SamplingParams(temperature=0.8, top_k=20), SamplingParams(temperature=0.7, top_p=0.5)]
)
def test_a_truncated_row_travels_sparse_and_comes_back_bit_exact(params):
    weights = wire_weights(params)
    for row in weights:
        message = encode_distribution(row)
        nonzero = row.nonzero().squeeze(-1).tolist()
        assert list(message.sparse_ids) == nonzero and not message.dense_f16
        assert len(message.sparse_f16) == 2 * len(nonzero)
        assert message.ByteSize() < 2 * VOCAB // 4
        assert_bit_exact(decode_distribution(message, VOCAB), row)


def test_normalising_the_decoded_weights_gives_exactly_the_q_the_draft_sampled_from():
    weights = wire_weights(SamplingParams(temperature=0.9, top_p=0.9), rows=4)
    decoded = decode_rows(encode_rows(weights), VOCAB)  # [4, V]
    assert torch.equal(normalize_probs(decoded), normalize_probs(weights))


def test_the_smaller_form_is_chosen_by_payload_size():
    vocab = 64  # dense payload: 128 bytes; a sparse entry costs 1 (varint id < 128) + 2 bytes
    for nonzero, form in [(1, "sparse"), (42, "sparse"), (43, "dense"), (64, "dense")]:
        row = torch.zeros(vocab)
        row[:nonzero] = 0.5
        message = encode_distribution(row)
        assert (form == "sparse") == bool(message.sparse_ids), f"{nonzero} non-zero weights"
        assert_bit_exact(decode_distribution(message, vocab), row)


def test_varint_sizes_follow_protobuf():
    ids = np.array([0, 127, 128, 16383, 16384, 2**21, 2**28])
    assert varint_size(ids) == 1 + 1 + 2 + 2 + 3 + 4 + 5
    message = worker_pb2.TokenDistribution(sparse_ids=ids.tolist())
    assert message.ByteSize() == 1 + 1 + varint_size(ids)  # tag + length + packed payload


def test_one_hot_rows_are_a_single_sparse_entry():
    row = torch.zeros(VOCAB)
    row[4095] = 1.0
    message = encode_distribution(row)
    assert list(message.sparse_ids) == [4095] and message.ByteSize() < 10
    assert_bit_exact(decode_distribution(message, VOCAB), row)


def test_batches_round_trip_and_an_empty_batch_decodes_to_zero_rows():
    weights = torch.cat([wire_weights(SamplingParams(temperature=1.0)), wire_weights(SamplingParams(1.0, top_k=5))])
    messages = encode_rows(weights)
    assert len(messages) == 6
    assert_bit_exact(decode_rows(messages, VOCAB), weights)
    assert decode_rows([], VOCAB).shape == (0, VOCAB)


@pytest.mark.parametrize(
    "row, match",
    [
        (torch.zeros(VOCAB), "no probability mass"),
        (torch.full((VOCAB,), 0.1), "not float16-exact"),
        (torch.tensor([0.5, -0.5]), "non-negative"),
        (torch.tensor([0.5, float("nan")]), "finite"),
        (torch.ones(2, 2), r"\[vocab\]"),
    ],
)
def test_rows_that_cannot_travel_losslessly_are_refused(row, match):
    with pytest.raises(ValueError, match=match):
        encode_distribution(row)


def test_malformed_messages_fail_clearly():
    with pytest.raises(ValueError, match="expected 8192"):
        decode_distribution(worker_pb2.TokenDistribution(dense_f16=b"\0" * 10), VOCAB)
    with pytest.raises(ValueError, match="value bytes"):
        decode_distribution(worker_pb2.TokenDistribution(sparse_ids=[1, 2], sparse_f16=b"\0\0"), VOCAB)
    with pytest.raises(ValueError, match="ascending"):
        decode_distribution(worker_pb2.TokenDistribution(sparse_ids=[2, 1], sparse_f16=b"\0" * 4), VOCAB)
    with pytest.raises(ValueError, match="ascending"):
        decode_distribution(worker_pb2.TokenDistribution(sparse_ids=[VOCAB], sparse_f16=b"\0" * 2), VOCAB)


def test_wire_q_carries_the_drafts_messages_unchanged_and_decodes_them_bit_exactly():
    """What a router forwards: the very messages the draft encoded (no decode, no re-encode)."""
    weights = wire_weights(SamplingParams(temperature=0.8, top_k=20), rows=4)  # [4, V]
    messages = encode_rows(weights)
    q = WireQ(messages)
    assert len(q) == 4 and all(a is b for a, b in zip(wire_q(q), q.messages))
    assert_bit_exact(q.decode(VOCAB), weights)
    assert_bit_exact(q[1:3].decode(VOCAB), weights[1:3])
    assert [m.SerializeToString() for m in wire_q(weights)] == [m.SerializeToString() for m in messages]
