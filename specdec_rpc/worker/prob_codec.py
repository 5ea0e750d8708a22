"""Draft distributions q on the wire: `worker_pb2.TokenDistribution`, bit-exact.

Encoding (one message per drafted position, see worker.proto):

* **dense**: ``dense_f16`` holds all ``vocab`` weights as IEEE-754 binary16, little-endian,
  index = token id (``2 * vocab`` bytes); ``sparse_ids`` is empty.
* **sparse**: ``sparse_ids`` holds the ids of the non-zero weights, ascending (packed
  varints), ``sparse_f16`` their binary16 values, little-endian, in the same order. Every
  other token has weight 0.

The encoder picks the smaller form (dense on a tie), so rows truncated by top-k / top-p
travel sparse and full softmax rows travel dense. An all-zero row cannot be encoded (it is
no distribution, and its sparse form would read as dense): it is rejected.

Losslessness: the draft rounds its weights w to float16 *before* sampling
(``DraftModelProposer(wire_dtype=torch.float16)``) and samples from ``normalize_probs(w)``;
the values are therefore float16-exact, this codec moves them without any change, and the
target normalises the very same w. The encoder refuses weights that are not float16-exact
instead of rounding them silently (rounding after sampling would change q).
"""

from __future__ import annotations

import numpy as np
import torch

from specdec_rpc.v1 import worker_pb2

WIRE_DTYPE = np.dtype("<f2")  # IEEE-754 binary16, little-endian
BYTES_PER_VALUE = WIRE_DTYPE.itemsize


def varint_size(values: np.ndarray) -> int:
    """Bytes of the protobuf varints of non-negative integers (the packed `sparse_ids` payload)."""
    values = values.astype(np.uint64)
    size = np.ones(values.shape, dtype=np.int64)
    for bits in (7, 14, 21, 28):
        size += values >= (1 << bits)
    return int(size.sum())


def _check_row(weights: torch.Tensor) -> np.ndarray:
    """Validate one [vocab] row and return it as float32 numpy."""
    if weights.dim() != 1:
        raise ValueError(f"a distribution row must be [vocab], got shape {tuple(weights.shape)}")
    row = weights.detach().to("cpu", torch.float32).numpy()
    if not np.isfinite(row).all() or (row < 0).any():
        raise ValueError("distribution weights must be finite and non-negative")
    if not row.any():
        raise ValueError("distribution row has no probability mass (all zeros)")
    if not np.array_equal(row.astype(WIRE_DTYPE).astype(np.float32), row):
        raise ValueError(
            "distribution weights are not float16-exact: the draft must round q to float16 before "
            "sampling (DraftModelProposer(wire_dtype=torch.float16)) so that it sends the q it sampled from"
        )
    return row


def encode_distribution(weights: torch.Tensor) -> worker_pb2.TokenDistribution:
    """[vocab] float16-exact non-negative weights -> TokenDistribution (dense or sparse, whichever is smaller)."""
    row = _check_row(weights)  # [vocab] float32
    ids = np.flatnonzero(row)  # [nnz] ascending
    sparse_bytes = varint_size(ids) + BYTES_PER_VALUE * ids.size
    if sparse_bytes < BYTES_PER_VALUE * row.size:
        return worker_pb2.TokenDistribution(
            sparse_ids=ids.tolist(), sparse_f16=row[ids].astype(WIRE_DTYPE).tobytes()
        )
    return worker_pb2.TokenDistribution(dense_f16=row.astype(WIRE_DTYPE).tobytes())


def decode_distribution(message: worker_pb2.TokenDistribution, vocab_size: int) -> torch.Tensor:
    """TokenDistribution -> [vocab_size] float32 weights, bit-exactly what was encoded."""
    if message.sparse_ids:
        ids = np.asarray(message.sparse_ids, dtype=np.int64)  # [nnz]
        if len(message.sparse_f16) != BYTES_PER_VALUE * ids.size:
            raise ValueError(
                f"sparse distribution has {ids.size} ids but {len(message.sparse_f16)} value bytes "
                f"(need {BYTES_PER_VALUE * ids.size})"
            )
        if ids[-1] >= vocab_size or (ids.size > 1 and (np.diff(ids) <= 0).any()):
            raise ValueError(f"sparse distribution ids must be ascending and < vocab_size={vocab_size}")
        row = np.zeros(vocab_size, dtype=np.float32)
        row[ids] = np.frombuffer(message.sparse_f16, dtype=WIRE_DTYPE)
        return torch.from_numpy(row)
    if len(message.dense_f16) != BYTES_PER_VALUE * vocab_size:
        raise ValueError(
            f"dense distribution has {len(message.dense_f16)} bytes, expected {BYTES_PER_VALUE * vocab_size} "
            f"for vocab_size={vocab_size}"
        )
    return torch.from_numpy(np.frombuffer(message.dense_f16, dtype=WIRE_DTYPE).astype(np.float32))


def encode_rows(weights: torch.Tensor) -> list[worker_pb2.TokenDistribution]:
    """[n, vocab] weights -> n TokenDistributions (one per drafted position)."""
    if weights.dim() != 2:
        raise ValueError(f"weights must be [n, vocab], got shape {tuple(weights.shape)}")
    return [encode_distribution(row) for row in weights]


def decode_rows(messages, vocab_size: int) -> torch.Tensor:
    """A sequence of n TokenDistributions -> [n, vocab_size] float32 weights."""
    rows = [decode_distribution(m, vocab_size) for m in messages]
    if not rows:
        return torch.zeros(0, vocab_size)
    return torch.stack(rows)  # [n, vocab_size]


class WireQ:
    """q as a draft worker sent it (specdec.proposers.drafts.EncodedQ): its TokenDistribution
    messages, one per drafted position, carried unchanged from the ProposeResponse to the
    VerifyRequest (the router never decodes them) and decoded only by the target."""

    def __init__(self, messages) -> None:
        self.messages = list(messages)  # [n] TokenDistribution

    def __len__(self) -> int:
        return len(self.messages)

    def __getitem__(self, positions: slice) -> "WireQ":
        return WireQ(self.messages[positions])

    def decode(self, vocab_size: int) -> torch.Tensor:
        """[n, vocab_size] float32 weights (raises ValueError on malformed messages)."""
        return decode_rows(self.messages, vocab_size)


def wire_q(q) -> list[worker_pb2.TokenDistribution]:
    """A row's q (Drafts.q: [n, vocab] weights or a WireQ) as the messages to send: a WireQ's
    own messages, unchanged; weights encoded."""
    return q.messages if isinstance(q, WireQ) else encode_rows(q)
