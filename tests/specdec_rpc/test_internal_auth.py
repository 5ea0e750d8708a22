"""Router <-> worker calls carry the cluster's secret; a worker refuses calls without it."""

import grpc
import pytest

from specdec_rpc.internal_auth import SECRET_ENV, configured_secret, secret_channel
from specdec_rpc.v1 import worker_pb2, worker_pb2_grpc
from specdec_rpc.worker_server import ServerThread


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
