"""FoundationDB backend: the KV seam over the official ``foundationdb`` binding.

``fdb://`` or ``fdb:///path/to/fdb.cluster`` opens a real cluster through libfdb_c;
``fdbsim://[name]`` runs the same code over ``quickzones.backends.fdb.sim`` (the in-process
simulator standing in for the binding). Importing this package loads no C library: the binding's
``fdb.api_version()`` runs once, on the first open. See docs/fdb.md.
"""

from quickzones.backends.fdb.loader import MissingFDBClient
from quickzones.backends.fdb.store import FDBStore, FDBTransaction, FDBVersionstamp
from quickzones.backends.fdb.url import DEFAULT_API_VERSION, FDBOptions, parse_fdb_url

__all__ = [
    "DEFAULT_API_VERSION",
    "FDBOptions",
    "FDBStore",
    "FDBTransaction",
    "FDBVersionstamp",
    "MissingFDBClient",
    "parse_fdb_url",
]
