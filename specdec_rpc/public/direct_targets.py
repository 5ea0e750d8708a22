"""Several addresses of one service as one gRPC target (the router replicas' own ports,
`serving.ingress: direct`: "10.0.0.5:40000,10.0.0.6:40000").

gRPC dials a comma-separated list only under its `ipv4:` or `ipv6:` scheme, where every entry
must be an IP address of that family: a host name, or a list that mixes the families, fails
only when the channel connects, with an error that names neither the entry nor the rule. So a
list is read here, before any channel exists: each entry is HOST:PORT ([IPv6]:PORT); a host
name is resolved once (the channel keeps those addresses; all of the name's addresses of the
list's family become entries, so a name for several replicas spreads over them all); one
family is chosen (the family of the list's IP addresses, else IPv4 when every name has an IPv4
address, as `serving.host: 0.0.0.0` binds IPv4 only, else IPv6); and anything that cannot fit
is refused with a ValueError naming its entry. `read_list` does every check that needs no
DNS (the syntax, IP addresses of both families), so a caller on an event loop refuses a bad
list at once and resolves the names off the loop.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable
from dataclasses import dataclass

#: a resolver: host, port -> its addresses (IP text); socket's by default
Resolve = Callable[[str, int], list[str]]
FAMILIES = {4: "IPv4", 6: "IPv6"}


@dataclass(frozen=True)
class Entry:
    """One HOST:PORT of the list, as written (`text`, its 1-based `number`), and its parts."""

    number: int
    text: str
    host: str
    port: int

    def where(self) -> str:
        return f"entry {self.number} {self.text!r}"


def several_addresses(target: str, resolve: Resolve | None = None) -> tuple[str, str]:
    """gRPC's target for a comma-separated list of addresses ("ipv4:a:p,b:q" or
    "ipv6:[a]:p,[b]:q") and the authority the channel presents (the first entry as written:
    what TLS checks the certificate against). ValueError naming the entry that cannot be dialled."""
    entries = read_list(target)
    addresses = {e: _addresses(e, resolve or system_resolve) for e in entries}
    family = _literal_family(entries) or _names_family(addresses)
    dialled: list[str] = []
    for entry in entries:
        ips = [_join(ip, entry.port) for ip in addresses[entry] if ip.version == family]
        if not ips:
            raise ValueError(f"{entry.where()}: {entry.host!r} has no {FAMILIES[family]} address, the family this "
                             "list is dialled in (gRPC dials one family per list)")
        dialled += [ip for ip in ips if ip not in dialled]
    return f"ipv{family}:" + ",".join(dialled), entries[0].text


def read_list(target: str) -> list[Entry]:
    """The list's entries, read without resolving a name (no DNS: instant, fine on an event
    loop): ValueError naming a malformed entry, or IP addresses of both families."""
    entries = [parse_entry(i + 1, text.strip()) for i, text in enumerate(target.split(","))]
    _literal_family(entries)
    return entries


def parse_entry(number: int, text: str) -> Entry:
    """HOST:PORT or [IPV6]:PORT; ValueError naming the entry otherwise."""
    where = f"entry {number} {text!r}"
    if not text:
        raise ValueError(f"{where}: empty (addresses are separated by single commas)")
    host, colon, port = text.rpartition(":")
    if text.startswith("["):
        if not host.endswith("]"):
            raise ValueError(f"{where}: an IPv6 address is written [ADDRESS]:PORT")
        host = host[1:-1]
    if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{where}: HOST:PORT expected, with a port in 1..65535")
    return Entry(number, text, host, int(port))


def system_resolve(host: str, port: int) -> list[str]:
    """The host's TCP addresses, in the system's order."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [info[4][0] for info in infos if info[0] in (socket.AF_INET, socket.AF_INET6)]


def _addresses(entry: Entry, resolve: Resolve) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    """The entry's IP address, or its host name's (resolved now)."""
    try:
        return [ipaddress.ip_address(entry.host)]
    except ValueError:
        pass
    try:
        found = resolve(entry.host, entry.port)
    except OSError as exc:
        raise ValueError(f"{entry.where()}: cannot resolve {entry.host!r}: {exc}") from None
    if not found:
        raise ValueError(f"{entry.where()}: {entry.host!r} resolves to no address")
    return [ipaddress.ip_address(ip) for ip in found]


def _literal_family(entries: list[Entry]) -> int | None:
    """The family of the list's IP addresses (None: it has none); refused when they mix."""
    literal = {e: _version(e.host) for e in entries if _version(e.host)}
    if len(set(literal.values())) > 1:
        first = {version: e for e, version in reversed(literal.items())}
        raise ValueError(f"{first[4].where()} is IPv4 and {first[6].where()} is IPv6: gRPC dials one family "
                         "per list (write every replica's address in the same family)")
    return next(iter(literal.values()), None)


def _names_family(addresses: dict[Entry, list]) -> int:
    """A list of names only: IPv4 when every name has an IPv4 address, else IPv6 (each name
    is checked against it after)."""
    return 4 if all(any(ip.version == 4 for ip in ips) for ips in addresses.values()) else 6


def _version(host: str) -> int | None:
    """4 or 6 for an IP address, None for a name."""
    try:
        return ipaddress.ip_address(host).version
    except ValueError:
        return None


def _join(ip: ipaddress.IPv4Address | ipaddress.IPv6Address, port: int) -> str:
    return f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}"
