"""Where a client on this machine reaches the router replicas' own ports (serving.ingress direct):
a replica on this node at serving.host (loopback for a wildcard), one on another node at that
node's address; the start waits until every replica lists its port."""

import pytest

from actors import direct_ingress
from specdec.config.config import load_config


@pytest.fixture
def targets(monkeypatch):
    found: list[list[tuple[str, int]]] = []
    monkeypatch.setattr(direct_ingress.ray.util, "get_node_ip_address", lambda: "10.0.0.1")
    monkeypatch.setattr(direct_ingress, "direct_targets", lambda app, protocol="gRPC": found.pop(0))
    monkeypatch.setattr(direct_ingress.time, "sleep", lambda s: None)
    return found


def serving(host: str, replicas: int = 2):
    return load_config(overrides={"serving": {"host": host, "ingress": "direct", "router_replicas": replicas}}).serving


def test_replicas_here_are_reached_at_the_bind_host_and_others_at_their_node(targets):
    targets.append([("10.0.0.1", 40000), ("10.0.0.2", 40000)])
    assert direct_ingress.direct_addresses("specdec", serving("0.0.0.0")) == ["127.0.0.1:40000", "10.0.0.2:40000"]
    targets.append([("10.0.0.1", 40001)])
    assert direct_ingress.direct_addresses("specdec", serving("10.0.0.1")) == ["10.0.0.1:40001"]


def test_the_start_waits_until_every_replica_lists_its_port(targets):
    targets += [[], [("10.0.0.1", 40000)], [("10.0.0.1", 40000), ("10.0.0.1", 40001)]]
    found = direct_ingress.wait_for_direct_addresses("specdec", serving("127.0.0.1"), timeout_s=60)
    assert found == ["127.0.0.1:40000", "127.0.0.1:40001"] and targets == []
    targets += [[]] * 3
    with pytest.raises(TimeoutError, match="0 of 2 router replicas"):
        direct_ingress.wait_for_direct_addresses("specdec", serving("127.0.0.1"), timeout_s=0)
