"""Router <-> worker calls carry the cluster's secret; a worker refuses calls without it."""

import sys
from pathlib import Path

import grpc
import pytest

from specdec.config.config import load_config
from specdec.sampling.sampling_params import SamplingParams
from specdec.verifiers.verifier import VerifyRequest
from specdec_rpc.worker.internal_auth import SECRET_ENV, configured_secret, secret_channel
from specdec_rpc.worker.remote_verifier import RemoteVerifier
from specdec_rpc.v1 import worker_pb2, worker_pb2_grpc
from specdec_rpc.worker.worker_server import ServerThread
from worker_slots import target_servicer

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "scripts"))
import worker_intruder  # noqa: E402


class Draft(worker_pb2_grpc.DraftWorkerServicer):
    def start(self):
        pass

    def close(self):
        pass

    async def GetInfo(self, request, context):  # noqa: N802
        return worker_pb2.WorkerInfo(model="tiny")


def test_the_secret_comes_from_the_file_then_the_environment_else_there_is_none(tmp_path):
    path = tmp_path / "secret"
    path.write_text("from-file\n")
    assert configured_secret(str(path), {SECRET_ENV: "from-env"}) == "from-file"
    assert configured_secret("", {SECRET_ENV: "from-env"}) == "from-env"
    assert configured_secret("", {}) is None
    path.write_text("\n")
    with pytest.raises(ValueError, match="is empty"):
        configured_secret(str(path), {})
    with pytest.raises(ValueError, match="internal_secret_file"):
        configured_secret(str(tmp_path / "absent"), {})


def test_a_worker_answers_only_calls_that_present_its_secret():
    with ServerThread(Draft(), secret="s3cret") as server:
        def info(secret):
            channel = secret_channel(server.address, secret)
            try:
                return worker_pb2_grpc.DraftWorkerStub(channel).GetInfo(worker_pb2.InfoRequest(), timeout=10).model
            finally:
                channel.close()

        assert info("s3cret") == "tiny"
        for wrong in (None, "s3cre", "s3cret!", "S3CRET"):
            with pytest.raises(grpc.RpcError) as error:
                info(wrong)
            assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert "s3cret" not in error.value.details()


def test_direct_calls_without_the_secret_never_reach_a_slot_while_the_router_is_served(prompt_ids):
    """The issue's attack: Verify (and Propose, GetInfo, KeepAlive) under a made-up lease,
    from a caller without the secret. None reaches a handler; every slot stays free for the
    router, which presents the secret."""
    config = load_config(overrides={"cache": {"num_slots": 2, "max_seq_len": 128}})
    with ServerThread(target_servicer(config), secret="s3cret") as server:
        answers = worker_intruder.intrude([("127.0.0.1", int(server.address.rsplit(":", 1)[1]), "target")], 60)
        assert sum(answers.values()) == 60 and worker_intruder.accepted(answers) == 0, answers
        assert server.servicer.info().free_slots == 2
        router = RemoteVerifier(server.address, timeout_s=30.0, secret="s3cret")
        try:
            [result] = router.verify([VerifyRequest("a", prompt_ids[0], [], SamplingParams())])
            assert len(result.emitted) == 1 and server.servicer.info().free_slots == 1
        finally:
            router.close()
