"""free_port picks ports that stay free until a server binds them: below the ephemeral range
(where outgoing connections take their local ports), free on every interface, never twice."""

from __future__ import annotations

import socket

from specdec.wiring.ports import bindable, ephemeral_low, free_port


def test_ports_are_below_the_ephemeral_range_free_everywhere_and_never_handed_out_twice():
    low = ephemeral_low()
    ports = [free_port() for _ in range(200)]
    assert len(set(ports)) == len(ports)
    if low > 20000:
        assert all(20000 <= p < low for p in ports)
    assert all(bindable("", p) and bindable("127.0.0.1", p) for p in ports[:20])


def test_a_port_a_server_holds_on_every_interface_counts_as_taken_on_each():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("", 0))
        assert not bindable("", taken.getsockname()[1])
        assert not bindable("127.0.0.1", taken.getsockname()[1])


def test_the_ephemeral_range_is_read_from_the_os_and_defaults_to_linuxs(tmp_path):
    ranges = tmp_path / "range"
    ranges.write_text("40000\t60999\n")
    assert ephemeral_low(ranges) == 40000
    assert ephemeral_low(tmp_path / "missing") == 32768
