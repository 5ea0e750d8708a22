"""`specdec status` says whose load it shows: the cluster's only while the measurements come
from the shared store; this replica's own otherwise (no Redis, or Redis unreachable). A
deadline, a grace period or a replica count that cannot work is a usage error naming it."""

import pytest

from specdec_cli.client_cli import format_status
from specdec_cli.serve_cli import build_parser
from specdec_rpc.v1 import specdec_pb2


@pytest.mark.parametrize("source, label", [("shared", "QPS (cluster)"), ("local", "QPS (this replica only)")])
def test_the_qps_row_names_where_its_measurements_come_from(source, label):
    table = format_status(specdec_pb2.GetStatsResponse(qps=3.5, measurements_source=source))
    [row] = [line for line in table.splitlines() if line.startswith("QPS")]
    assert row.startswith(label) and row.endswith("3.50")


@pytest.mark.parametrize("argv, message", [
    (["client", "health", "--timeout", "0"], "argument --timeout: must be > 0 seconds, got 0"),
    (["status", "--timeout", "soon"], "argument --timeout: not a number of seconds: 'soon'"),
    (["drain", "--replicas", "0"], "argument --replicas: a whole number >= 1 expected, got '0'"),
    (["drain", "--grace", "-5"], "argument --grace: must be >= 0 seconds, got -5"),
])
def test_numbers_that_cannot_work_are_usage_errors_naming_the_option(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(argv)
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_a_zero_grace_period_is_a_drain_that_ends_in_flight_requests_at_once():
    assert build_parser().parse_args(["drain", "--grace", "0", "--replicas", "2"]).grace == 0.0


def test_a_ca_file_that_cannot_be_read_is_bad_input_naming_the_option(tmp_path, capsys):
    from specdec_cli.serve_cli import main

    missing = tmp_path / "ca.pem"
    assert main(["client", "health", "--server", "127.0.0.1:1", "--tls-ca", str(missing)]) == 2
    assert f"argument --tls-ca: cannot read '{missing}': No such file or directory" in capsys.readouterr().err
