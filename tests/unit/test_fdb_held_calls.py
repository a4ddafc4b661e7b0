"""libfdb_c calls that return at once keep the GIL (``quickzones.backends.fdb.held_calls``):
a consumer's threads do not hand the GIL to each other around every write, read and
future they make (issue 44 point 5), and nothing that may wait or run a Python callback
is among them. Against a real cluster."""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from quickzones.backends.fdb import FDBStore
from quickzones.client import Quick
from quickzones.store.kv import KVError, run
from tests.conftest import HAVE_FDB, fdb_store_url

pytestmark = pytest.mark.skipif(not HAVE_FDB, reason="needs a FoundationDB cluster")

TRANSACTION_CANCELLED = 1025


@pytest.fixture
def store() -> Iterator[FDBStore]:
    s = FDBStore.from_url(fdb_store_url())
    yield s
    s.close()


def _keeps_gil(fn: Any) -> bool:
    return bool(fn._flags_ & ctypes._FUNCFLAG_PYTHONAPI)  # type: ignore[attr-defined]


def test_the_calls_of_a_drained_item_keep_the_gil(store: FDBStore) -> None:
    import fdb.impl

    capi = fdb.impl._capi
    for name in (
        "fdb_database_create_transaction",
        "fdb_transaction_set",
        "fdb_transaction_clear",
        "fdb_transaction_get",
        "fdb_transaction_get_range",
        "fdb_transaction_commit",
        "fdb_future_is_ready",
        "fdb_future_get_value",
        "fdb_future_destroy",
    ):
        assert _keeps_gil(getattr(capi, name)), name


def test_the_calls_that_may_wait_or_run_python_let_it_go(store: FDBStore) -> None:
    import fdb.impl

    capi = fdb.impl._capi
    for name in ("fdb_future_block_until_ready", "fdb_future_set_callback", "fdb_run_network"):
        assert not _keeps_gil(getattr(capi, name)), name


def test_an_error_from_a_held_call_is_still_a_kv_error(store: FDBStore) -> None:
    tr = store.create_transaction()
    tr.cancel()
    with pytest.raises(KVError) as err:
        tr.get(b"k")
    assert err.value.code == TRANSACTION_CANCELLED


def test_threads_drain_while_the_main_thread_waits_through_callbacks() -> None:
    """The main thread's waits run a Python callback on the network thread (the binding's
    semaphore); consumer threads holding the GIL through their calls never stall it."""
    q = Quick.open(fdb_store_url())
    ran: list[int] = []
    q.job("note")(lambda payload, ctx: ran.append(payload["n"]))
    for n in range(200):
        q.enqueue("note", {"n": n}, app="a", tenant=f"t{n % 7}")
    drained: dict[str, int] = {}

    def drain() -> None:
        drained["n"] = q.run_until_idle()

    t = threading.Thread(target=drain)
    t.start()
    store = q.kv
    # The main thread reads and writes meanwhile, each wait through the callback.
    for i in range(100):
        run(store, lambda tr, i=i: tr.set(b"main/%d" % i, b"x"))
        assert run(store, lambda tr, i=i: tr.get(b"main/%d" % i)) == b"x"
    t.join(120)
    q.close()
    assert not t.is_alive()
    assert drained["n"] == 200
    assert sorted(ran) == list(range(200))


def test_installing_twice_changes_nothing(store: FDBStore) -> None:
    import fdb.impl

    from quickzones.backends.fdb import held_calls

    first = fdb.impl._capi.fdb_transaction_set
    held_calls.install(store.fdb)
    assert fdb.impl._capi.fdb_transaction_set is first


def test_the_simulator_is_left_as_it_is() -> None:
    from quickzones.backends.fdb import held_calls
    from quickzones.backends.fdb.sim import sim_module
    from quickzones.backends.memory import MemoryStore

    module = sim_module(MemoryStore.from_url("memory://"))
    held_calls.install(module)  # no fdb.impl._capi there: nothing to change, no error
    assert FDBStore.from_url("fdbsim://").fdb is not None
