"""The router's share of a sampled round's q: from the draft worker's reply to the target's request.

A sampled round carries the draft's q (one distribution over the vocabulary per drafted
token) from the draft worker through the router to the target. The router passes the
worker's encoded messages on as they came (prob_codec.WireQ); this measures what it still
spends per round on the way: parsing the ProposeResponse, making each row's Drafts and
building and serialising the VerifyRequest (no Ray, no sockets: the router's CPU time only).
Rows are γ = 4 drafts of full-softmax (dense) or top-k 50 (sparse) float16 q.

Usage: python benchmarks/bench_q_path.py [--vocab 4096] [--batch 1 8 32] [--repeats 30]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from specdec.proposers.base import ProposalRequest
from specdec.sampling.sampling import SamplingBatch, logits_to_probs
from specdec.sampling.sampling_params import SamplingParams
from specdec.verifiers.verifier import VerifyRequest
from specdec_rpc.worker.history_sync import HistorySender
from specdec_rpc.worker.prob_codec import encode_rows
from specdec_rpc.worker.remote_proposer import RemoteProposer
from specdec_rpc.worker.remote_verifier import RemoteVerifier
from specdec_rpc.v1 import worker_pb2

GAMMA = 4


def clients() -> tuple[RemoteProposer, RemoteVerifier]:
    """The two clients' data path only (no channel: nothing is sent)."""
    proposer, verifier = RemoteProposer.__new__(RemoteProposer), RemoteVerifier.__new__(RemoteVerifier)
    proposer._sender, verifier._sender = HistorySender(namespace="p/"), HistorySender(namespace="v/")
    return proposer, verifier


def reply(proposer: RemoteProposer, requests: list[ProposalRequest], vocab: int) -> bytes:
    """A serialised ProposeResponse with γ drafts and their encoded q per request."""
    drafts = []
    for request in requests:
        logits = torch.randn(GAMMA, vocab) * 3
        q = logits_to_probs(logits, SamplingBatch.from_params([request.sampling] * GAMMA)).half().float()
        draft = worker_pb2.DraftedTokens(seq_id=proposer._sender.wire_id(request.seq_id),
                                         token_ids=q.argmax(-1).tolist())
        draft.probs.extend(encode_rows(q))  # [γ] TokenDistribution
        drafts.append(draft)
    return worker_pb2.ProposeResponse(drafts=drafts).SerializeToString()


def one_round(proposer: RemoteProposer, verifier: RemoteVerifier, requests: list[ProposalRequest],
              response: bytes) -> bytes:
    """What the router does with a round's q: reply -> Drafts -> VerifyRequest bytes."""
    drafts = list(worker_pb2.ProposeResponse.FromString(response).drafts)
    rows = [(r, d.first(r.gamma)) for r, d in zip(requests, proposer._proposal(requests, drafts))]
    items = [verifier._item(VerifyRequest(r.seq_id, r.token_ids, d.token_ids, r.sampling, d.q)) for r, d in rows]
    return worker_pb2.VerifyRequest(items=items).SerializeToString()


def measure(vocab: int, batch: int, top_k: int, repeats: int) -> dict:
    torch.manual_seed(batch * 100 + top_k)
    proposer, verifier = clients()
    sampling = SamplingParams(temperature=1.0, top_k=top_k)
    requests = [ProposalRequest(f"s{i}", list(range(1, 40)), sampling, gamma=GAMMA) for i in range(batch)]
    for r in requests:  # steady rounds: the histories are known on both sides, deltas are small
        proposer._sender.delta(r.seq_id, r.token_ids, r.sampling)
        verifier._sender.delta(r.seq_id, r.token_ids, r.sampling)
    response = reply(proposer, requests, vocab)
    sent = one_round(proposer, verifier, requests, response)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        one_round(proposer, verifier, requests, response)
        times.append(time.perf_counter() - start)
    return {"q": "dense" if top_k == 0 else f"top-k {top_k}", "batch": batch,
            "ms": 1000 * statistics.median(times), "kib": len(sent) / 1024}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vocab", type=int, default=4096, help="vocabulary size (the bundled models': 4096)")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print("| q | rows | router q path per round (ms, median) | VerifyRequest (KiB) |")
    print("|---|---:|---:|---:|")
    for top_k in (0, 50):
        for batch in args.batch:
            row = measure(args.vocab, batch, top_k, args.repeats)
            print(f"| {row['q']} | {row['batch']} | {row['ms']:.3f} | {row['kib']:.0f} |")


if __name__ == "__main__":
    main()
