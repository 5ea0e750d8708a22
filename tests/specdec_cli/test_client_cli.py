"""`specdec status` says whose load it shows: the cluster's only while the measurements come
from the shared store; this replica's own otherwise (no Redis, or Redis unreachable)."""

import pytest

from specdec_cli.client_cli import format_status
from specdec_rpc.v1 import specdec_pb2


@pytest.mark.parametrize("source, label", [("shared", "QPS (cluster)"), ("local", "QPS (this replica only)")])
def test_the_qps_row_names_where_its_measurements_come_from(source, label):
    table = format_status(specdec_pb2.GetStatsResponse(qps=3.5, measurements_source=source))
    [row] = [line for line in table.splitlines() if line.startswith("QPS")]
    assert row.startswith(label) and row.endswith("3.50")
