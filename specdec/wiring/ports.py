"""A free TCP port for a server this process is about to start.

The port is picked below the OS's ephemeral range (Linux: /proc/sys/net/ipv4/ip_local_port_range),
where outgoing connections take their local ports: a process running Ray opens many, and a
port picked inside that range can be taken by one of them before the server binds it (seen:
Serve's gRPC proxy failing to bind [::]:39335). It must be free both on `host` and on every
interface, since servers such as Serve's proxy bind the wildcard address.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

PORT_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST_PORT = 20000  # below: ports that well-known services tend to use
TRIES = 64
_handed_out: set[int] = set()  # ports this process returned already: two servers must not get the same


def ephemeral_low(path: Path = PORT_RANGE_FILE) -> int:
    """The first port of the OS's ephemeral range (32768, Linux's default, where unknown)."""
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def bindable(host: str, port: int) -> bool:
    """Whether a TCP server could bind (host, port) right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on `host` and on every interface right now, below the ephemeral range
    where one exists (else any port the OS reports free on `host`)."""
    low = ephemeral_low()
    if low > LOWEST_PORT:
        for port in random.sample(range(LOWEST_PORT, low), min(TRIES, low - LOWEST_PORT)):
            if port not in _handed_out and bindable(host, port) and bindable("", port):
                _handed_out.add(port)
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]
