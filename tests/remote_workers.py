"""Real draft and target workers on 127.0.0.1 (grpc.aio servers on threads, no Ray) and engines
whose verifier and draft proposer are their gRPC clients: what the remote engine's tests run on."""

from __future__ import annotations

from specdec.config.config import load_config
from specdec.round.draft_ahead import DraftAhead
from specdec.round.engine import SpeculativeEngine
from specdec.proposers.composite_proposer import CompositeProposer
from specdec.proposers.ngram_proposer import NgramProposer
from specdec_rpc.worker.draft_servicer import DraftServicer
from specdec_rpc.worker.remote_proposer import RemoteProposer
from specdec_rpc.worker.remote_verifier import RemoteVerifier
from specdec_rpc.worker.target_servicer import TargetServicer
from specdec_rpc.worker.worker_server import ServerThread
import worker_slots

MAX_NEW = 32
NUM_SLOTS = 8
CONFIG = load_config(overrides={"cache": {"num_slots": NUM_SLOTS, "max_seq_len": 256}})


def target_servicer() -> TargetServicer:
    return worker_slots.target_servicer(CONFIG)


def started_workers():
    """A draft and a target worker on 127.0.0.1, each on its own event loop thread."""
    workers = {"draft": ServerThread(DraftServicer.from_config(CONFIG)), "target": ServerThread(target_servicer())}
    yield workers  # a test may replace a worker (restart); the current ones are stopped
    for server in workers.values():
        server.stop()


def engine_maker(workers, tokenizer):
    """make(proposer, gamma) -> an engine whose verifier and draft proposer are gRPC clients."""
    clients = []

    def make(proposer: str = "draft", gamma: int = 4, draft_address: str | None = None, timeout_s: float = 30.0,
             draft_ahead: DraftAhead | None = None, prefill_chunk_tokens: int | None = None):
        verifier = RemoteVerifier(workers["target"].address, timeout_s)
        draft = RemoteProposer(draft_address or workers["draft"].address, timeout_s)
        clients.extend([verifier, draft])
        composite = CompositeProposer({"draft": draft, "ngram": NgramProposer()}, proposer)
        return SpeculativeEngine(verifier, composite, gamma, eos_token_ids=[tokenizer.eos_token_id],
                                 draft_ahead=draft_ahead, prefill_chunk_tokens=prefill_chunk_tokens)

    yield make
    for client in clients:
        client.close()


def target_info(workers):
    return workers["target"].servicer.info()


def restart(workers):
    """Replace both workers by fresh ones on the same addresses (all their state is lost)."""
    for name, make_servicer in (("target", target_servicer), ("draft", lambda: DraftServicer.from_config(CONFIG))):
        old = workers[name]
        old.stop()
        host, port = old.address.rsplit(":", 1)
        workers[name] = ServerThread(make_servicer(), host, int(port))
