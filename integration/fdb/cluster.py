"""A FoundationDB cluster for the test suites, and why there may be none.

Where the cluster comes from, in order (``quickzones.testing.provision.provide_fdb_cluster_file``):

1. ``FDB_CLUSTER_FILE`` (or ``QUICK_FDB_CLUSTER_FILE``) names the cluster file of a running
   cluster. The tests write only under ``conf/`` and random ``quick-*`` prefixes and clear
   them afterwards, but still: use a test cluster.
2. An ``fdbserver`` binary, from ``FDB_BIN_DIR``, then ``shared/fdb/bin`` in an ancestor of
   the checkout (CI: ``../shared/fdb``), then ``PATH``: started on a free 127.0.0.1 port in
   a temporary directory, configured ``single memory``, killed at exit or with pytest.
   Its ``lib/libfdb_c.so`` is what the binding loads (``FDB_LIBRARY_PATH``).
3. A Docker engine: ``foundationdb/foundationdb:7.3.x`` started with testcontainers.
4. None: the suites skip with one line, unless ``QUICK_REQUIRE_FDB=1`` (set by
   ``scripts/test`` when it found a build), which makes that a failure.

One cluster serves the whole session (:func:`session_cluster_file`).
"""

from __future__ import annotations

from quickzones.testing.provision import (
    NO_FDB,
    ServiceUnavailable,
    fdb_required,
    fdb_skip_reason,
    shared_fdb_cluster_file,
)


def skip_reason() -> str | None:
    """Why the real-FDB tests cannot run here, or None if they can."""
    return fdb_skip_reason()


def session_cluster_file() -> str:
    """The session's cluster file, started on first use. Fails loudly rather than skips:
    by the time a test asks, :func:`skip_reason` said a cluster can be had."""
    try:
        return str(shared_fdb_cluster_file())
    except ServiceUnavailable as err:
        raise RuntimeError(f"FoundationDB was expected but is unavailable: {err}") from err


__all__ = ["NO_FDB", "fdb_required", "session_cluster_file", "skip_reason"]
