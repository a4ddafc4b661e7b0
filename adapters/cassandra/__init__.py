"""Cassandra zones: work items in Cassandra, pointers in a KV store (paper section 6.1).

Imports no driver at import time; connecting without ``cassandra-driver`` installed raises
MissingDependency naming the ``cassandra`` extra.
"""

from quickzones.adapters.cassandra.driver import CassandraError
from quickzones.adapters.cassandra.quick import CassandraQuick, open_cassandra_quick
from quickzones.adapters.cassandra.schema import init_schema
from quickzones.adapters.cassandra.store import CassandraZoneStore
from quickzones.adapters.cassandra.url import CassandraURL, parse_cassandra_url

__all__ = [
    "CassandraError",
    "CassandraQuick",
    "CassandraURL",
    "CassandraZoneStore",
    "init_schema",
    "open_cassandra_quick",
    "parse_cassandra_url",
]
