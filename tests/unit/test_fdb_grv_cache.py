"""``fdb://...?grv_cache=1``: the transactions the core marks causal-read-risky (peeks,
pointer leases) take libfdb_c's cached read version (``use_grv_cache``) instead of asking
a GRV proxy. A cached version is a committed one, possibly not the newest; FoundationDB's
rules still hold for it (docs/fdb-semantics.md sections 2 and 5): a transaction that
writes conflicts on anything committed after its read version, and this client's own
commits are never missed. Against a real cluster, in a child process: the option needs
the network option ``disable_client_bypass``, settable only before a process's first open.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from quickzones.backends.fdb import FDBStore
from quickzones.backends.fdb.url import parse_fdb_url
from tests.conftest import HAVE_FDB, fdb_store_url


def _calls(tr: Any) -> list[tuple[str, int | None]]:
    calls: list[tuple[str, int | None]] = tr._tr.options.calls
    return calls


def test_grv_cache_is_off_unless_the_url_asks() -> None:
    assert parse_fdb_url("fdb://").options.grv_cache is False
    assert parse_fdb_url("fdb://?grv_cache=1").options.grv_cache is True


def test_only_the_hinted_transactions_take_the_cached_read_version() -> None:
    store = FDBStore.from_url("fdbsim://?grv_cache=1")
    plain = store.create_transaction()
    plain.get(b"k")
    assert _calls(plain) == []  # visits, completions, enqueues: a fresh read version
    hinted = store.create_transaction()
    hinted.set_causal_read_risky()
    assert _calls(hinted) == [("causal_read_risky", None), ("use_grv_cache", None)]
    declined = FDBStore.from_url("fdbsim://?grv_cache=1&causal_read_risky=0").create_transaction()
    declined.set_causal_read_risky()
    assert _calls(declined) == []


CHILD = r"""
import sys
from quickzones.backends.fdb import FDBStore
from quickzones.store.kv import KVError

url = sys.argv[1]
store = FDBStore.from_url(url + "&grv_cache=1")

def hinted():
    tr = store.create_transaction()
    tr.set_causal_read_risky()
    return tr

def committed(key, value):
    tr = store.create_transaction()
    tr.set(key, value)
    tr.commit()
    return tr.get_committed_version()

# The first transaction through the multi-version client may meet 1039
# (cluster_version_changed, retryable): the core's run() retries it.
for _ in range(20):
    tr = hinted()
    try:
        tr.get(b"k")
        break
    except KVError as err:
        tr.on_error(err)

# This client's own commit is never missed by a cached read version.
for i in range(50):
    version = committed(b"k", b"%d" % i)
    tr = hinted()
    assert tr.get_read_version() >= version, "a cached read version below our own commit"
    assert tr.get(b"k") == b"%d" % i

# A hinted transaction that writes still aborts on a write committed after its read version.
tr = hinted()
assert tr.get(b"k") == b"49"
committed(b"k", b"other")
tr.set(b"lease", b"mine")
try:
    tr.commit()
except KVError as err:
    assert err.code == 1020, err.code
else:
    raise AssertionError("committed over a conflicting write")
check = store.create_transaction()
assert check.get(b"lease") is None and check.get(b"k") == b"other"
print("ok")
"""

LATE = r"""
import sys
import fdb
from quickzones.backends.fdb import FDBStore
from quickzones.errors import ConfigurationError

url = sys.argv[1]
FDBStore.from_url(url)  # the network starts without disable_client_bypass
try:
    FDBStore.from_url(url + "&grv_cache=1")
except ConfigurationError as err:
    assert "disable_client_bypass" in str(err), err
    print("ok")
"""


def _child(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code, fdb_store_url()],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip()


@pytest.mark.skipif(not HAVE_FDB, reason="needs a FoundationDB cluster")
def test_a_cached_read_version_sees_our_commits_and_still_conflicts() -> None:
    assert _child(CHILD) == "ok"


@pytest.mark.skipif(not HAVE_FDB, reason="needs a FoundationDB cluster")
def test_grv_cache_after_the_network_started_is_a_configuration_error() -> None:
    assert _child(LATE) == "ok"
