"""Parsing ``fdb://`` and ``fdbsim://`` URLs into :class:`FDBOptions`.

    fdb://                                  default cluster file (FDB_CLUSTER_FILE, then the
                                            platform default), resolved by libfdb_c
    fdb:///etc/foundationdb/fdb.cluster     an explicit cluster file
    fdbsim://[name]                         the same backend over the in-process simulator

Query options (all optional):

    api_version=730          passed to ``fdb.api_version`` on first open (>= 610)
    root=<bytes>             fixed raw key prefix, percent-encoded (``root=%15%2A``)
    directory=app,quick      key prefix allocated by the directory layer at this path
    timeout_ms=5000          default transaction timeout (database option)
    retry_limit=100          default retry limit of on_error (database option)
    max_retry_delay_ms=1000  cap of on_error's backoff (database option)
    causal_read_risky=1      honour the core's causal-read-risky hint (0 turns it off)

``fdbsim://`` also passes the simulator's own options (``seed``, ``fault_*``,
``latency_ms``) through to ``memory://``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from urllib.parse import parse_qsl, unquote_to_bytes, urlencode, urlsplit

from quickzones.errors import InvalidStoreURL

DEFAULT_API_VERSION = 730
# From 610 on, timeout and retry limit survive on_error, which the seam's run() relies on.
MIN_API_VERSION = 610

FDB_OPTIONS = (
    "api_version",
    "root",
    "directory",
    "timeout_ms",
    "retry_limit",
    "max_retry_delay_ms",
    "causal_read_risky",
    "snapshot_reads",
)
# Options of memory:// that fdbsim:// forwards to the simulator.
SIM_OPTIONS = (
    "seed",
    "fault_not_committed",
    "fault_unknown_result",
    "fault_unknown_result_applied",
    "fault_too_old",
    "latency_ms",
)

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


@dataclass(frozen=True, slots=True)
class FDBOptions:
    """Everything an ``fdb://`` URL configures; also the keyword form of ``FDBStore``."""

    cluster_file: str | None = None
    api_version: int = DEFAULT_API_VERSION
    root: bytes = b""
    directory: tuple[str, ...] = ()
    timeout_ms: int | None = None
    retry_limit: int | None = None
    max_retry_delay_ms: int | None = None
    causal_read_risky: bool = True
    snapshot_reads: bool = True

    def __post_init__(self) -> None:
        if self.root and self.directory:
            raise ValueError("root and directory are exclusive: give one key prefix mode")
        if self.api_version < MIN_API_VERSION:
            raise ValueError(f"api_version must be >= {MIN_API_VERSION}, got {self.api_version}")
        if self.root.startswith(b"\xff"):
            raise ValueError("root must not start with 0xff (the system keyspace)")


@dataclass(frozen=True, slots=True)
class ParsedFDBURL:
    """A parsed URL: the options, and for ``fdbsim://`` the ``memory://`` URL to open."""

    options: FDBOptions
    sim_url: str | None = None


def _int(url: str, name: str, raw: str, minimum: int) -> int:
    try:
        value = int(raw)
    except ValueError as err:
        raise InvalidStoreURL(url, f"option {name}={raw!r} is not an integer") from err
    if value < minimum:
        raise InvalidStoreURL(url, f"option {name}={value} must be >= {minimum}")
    return value


def _bool(url: str, name: str, raw: str) -> bool:
    if raw.lower() in _TRUE:
        return True
    if raw.lower() in _FALSE:
        return False
    raise InvalidStoreURL(url, f"option {name}={raw!r} must be 1 or 0")


def parse_fdb_url(url: str) -> ParsedFDBURL:
    """Parse ``fdb://[/cluster/file][?options]`` or ``fdbsim://[name][?options]``."""
    try:
        parts = urlsplit(url)
    except ValueError as err:
        raise InvalidStoreURL(url, str(err)) from err
    scheme = parts.scheme.lower()
    if scheme not in ("fdb", "fdbsim"):
        raise InvalidStoreURL(url, "expected the fdb:// or fdbsim:// scheme")
    cluster_file: str | None = None
    if scheme == "fdb":
        if parts.netloc:
            # fdb://host/... would silently ignore the host; the cluster file names the hosts.
            raise InvalidStoreURL(
                url,
                "an fdb URL names a cluster file, not a host: use fdb:// or "
                "fdb:///etc/foundationdb/fdb.cluster",
            )
        if parts.path not in ("", "/"):
            cluster_file = unquote_to_bytes(parts.path).decode()
        else:
            # libfdb_c reads FDB_CLUSTER_FILE itself; resolving it here only makes errors and
            # FDBStore.cluster_file name the file actually used.
            cluster_file = os.environ.get("FDB_CLUSTER_FILE") or None
    elif parts.path not in ("", "/"):
        raise InvalidStoreURL(url, "an fdbsim URL has no path; name a shared store fdbsim://name")

    values: dict[str, object] = {}
    sim_query: list[tuple[str, str]] = []
    # latin-1 maps each percent-encoded byte of root=... to exactly one byte.
    for name, raw in parse_qsl(parts.query, keep_blank_values=True, encoding="latin-1"):
        if name in values:
            raise InvalidStoreURL(url, f"option {name!r} given twice")
        if name == "api_version":
            values[name] = _int(url, name, raw, MIN_API_VERSION)
        elif name == "root":
            values[name] = raw.encode("latin-1")
        elif name == "directory":
            path = tuple(p for p in raw.encode("latin-1").decode().split(",") if p)
            if not path:
                raise InvalidStoreURL(url, "directory needs a path such as directory=app,quick")
            values[name] = path
        elif name in ("timeout_ms", "max_retry_delay_ms"):
            values[name] = _int(url, name, raw, 0)
        elif name == "retry_limit":
            values[name] = _int(url, name, raw, -1)
        elif name in ("causal_read_risky", "snapshot_reads"):
            values[name] = _bool(url, name, raw)
        elif scheme == "fdbsim" and name in SIM_OPTIONS:
            sim_query.append((name, raw))
        else:
            known = FDB_OPTIONS + (SIM_OPTIONS if scheme == "fdbsim" else ())
            raise InvalidStoreURL(url, f"unknown option {name!r}; known: {', '.join(known)}")
    try:
        options = FDBOptions(cluster_file=cluster_file, **values)  # type: ignore[arg-type]
    except ValueError as err:
        raise InvalidStoreURL(url, str(err)) from err
    sim_url = None
    if scheme == "fdbsim":
        sim_url = f"memory://{parts.netloc}"
        if sim_query:
            sim_url += "?" + urlencode(sim_query)
    return ParsedFDBURL(options, sim_url)
