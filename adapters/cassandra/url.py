"""``cassandra://h1,h2:9042/keyspace?consistency=QUORUM`` URLs."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import parse_qsl, urlsplit

from quickzones.errors import InvalidStoreURL

_LEVELS = {
    "ONE",
    "TWO",
    "THREE",
    "QUORUM",
    "ALL",
    "LOCAL_QUORUM",
    "EACH_QUORUM",
    "LOCAL_ONE",
}
_SERIAL_LEVELS = {"SERIAL", "LOCAL_SERIAL"}


@dataclass(frozen=True, slots=True)
class CassandraURL:
    """A parsed Cassandra URL.

    ``consistency`` is used for plain reads and writes (QUORUM by default: a read sees
    every acknowledged write); ``serial_consistency`` for lightweight transactions and
    the reads that must see their state (emptiness checks, outcome of a timed-out LWT).
    """

    hosts: tuple[str, ...]
    port: int
    keyspace: str
    consistency: str = "QUORUM"
    serial_consistency: str = "SERIAL"
    local_dc: str = "datacenter1"
    timeout_s: float = 10.0
    connect_timeout_s: float = 5.0
    protocol_version: int = 5
    table: str = "zone_rows"

    @property
    def display(self) -> str:
        return f"cassandra://{','.join(self.hosts)}:{self.port}/{self.keyspace}"


def _ident(url: str, what: str, value: str) -> str:
    if not value or not (value[0].isalpha() and value.replace("_", "a").isalnum()):
        raise InvalidStoreURL(url, f"{what} {value!r} must be a CQL identifier (letters, _)")
    if len(value) > 48:
        raise InvalidStoreURL(url, f"{what} {value!r} is longer than 48 characters")
    return value


def _contact_point(url: str, spec: str) -> tuple[str, int | None]:
    """``host``, ``host:port``, ``[v6]`` or ``[v6]:port``; a bare IPv6 address without
    brackets is taken whole (its colons are not a port)."""
    if spec.startswith("["):
        host, bracket, rest = spec[1:].partition("]")
        if not bracket or not host:
            raise InvalidStoreURL(url, f"bad contact point {spec!r}")
        if not rest:
            return host, None
        if not rest.startswith(":"):
            raise InvalidStoreURL(url, f"bad contact point {spec!r}")
        port_text = rest[1:]
    elif spec.count(":") == 1:
        host, _, port_text = spec.partition(":")
    else:
        return spec, None
    try:
        port = int(port_text)
    except ValueError as err:
        raise InvalidStoreURL(url, f"bad port {port_text!r}") from err
    if not 0 < port < 65536:
        raise InvalidStoreURL(url, f"port {port} out of range")
    return host, port


def parse_cassandra_url(url: str) -> CassandraURL:
    """Parse ``cassandra://h1[:port],h2[:port]/keyspace?consistency=..&serial_consistency=..
    &local_dc=..&timeout=..&connect_timeout=..&protocol_version=..&table=..``."""
    try:
        parts = urlsplit(url)
    except ValueError as err:
        raise InvalidStoreURL(url, str(err)) from err
    if parts.scheme.lower() != "cassandra":
        raise InvalidStoreURL(url, "expected the cassandra:// scheme")
    hosts: list[str] = []
    ports: set[int] = set()
    for spec in parts.netloc.split(","):
        spec = spec.strip()
        if not spec:
            continue
        host, port = _contact_point(url, spec)
        hosts.append(host)
        if port is not None:
            ports.add(port)
    if not hosts:
        raise InvalidStoreURL(url, "no contact points (cassandra://host1,host2:9042/keyspace)")
    if len(ports) > 1:
        # The driver takes one port for every contact point.
        raise InvalidStoreURL(url, f"contact points name different ports {sorted(ports)}")
    port = ports.pop() if ports else 9042
    keyspace = _ident(url, "keyspace", parts.path.strip("/"))
    options: dict[str, object] = {}
    for name, raw in parse_qsl(parts.query, keep_blank_values=True):
        if name == "consistency":
            if raw.upper() not in _LEVELS:
                raise InvalidStoreURL(url, f"unknown consistency {raw!r}")
            options["consistency"] = raw.upper()
        elif name == "serial_consistency":
            if raw.upper() not in _SERIAL_LEVELS:
                raise InvalidStoreURL(url, "serial_consistency must be SERIAL or LOCAL_SERIAL")
            options["serial_consistency"] = raw.upper()
        elif name == "local_dc":
            options["local_dc"] = raw
        elif name in ("timeout", "connect_timeout"):
            try:
                seconds = float(raw)
            except ValueError as err:
                raise InvalidStoreURL(url, f"{name} must be seconds") from err
            if not seconds > 0:
                raise InvalidStoreURL(url, f"{name} must be positive")
            options[f"{name}_s"] = seconds
        elif name == "protocol_version":
            if raw not in ("3", "4", "5"):
                raise InvalidStoreURL(url, "protocol_version must be 3, 4 or 5")
            options["protocol_version"] = int(raw)
        elif name == "table":
            options["table"] = _ident(url, "table", raw)
        else:
            raise InvalidStoreURL(url, f"unknown option {name!r}")
    return CassandraURL(tuple(hosts), port, keyspace, **options)  # type: ignore[arg-type]
