"""The processes of a running Ray cluster on this host: live actors' PIDs, their listening sockets."""

from __future__ import annotations

import psutil


def actor_pids(class_suffix: str) -> list[int]:
    """PIDs of the live actors of a class, from Ray's actor table."""
    from ray._private.state import actors

    return [a["Pid"] for a in actors().values() if a["State"] == "ALIVE" and a["ActorClassName"].endswith(class_suffix)]


def listening_sockets(pids: list[int]) -> set[tuple[str, int]]:
    """(ip, port) of every TCP socket the processes `pids` listen on."""
    return {(c.laddr.ip, c.laddr.port) for c in psutil.net_connections("tcp")
            if c.status == psutil.CONN_LISTEN and c.pid in pids}
