"""A consumer's FoundationDB waits leave the client's network thread alone
(``quickzones.backends.fdb.waits``): a thread other than the main one waits in libfdb_c,
not on a semaphore that a Python callback on the network thread releases, while the main
thread keeps the binding's wait so a signal still reaches it. Against a real cluster."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from quickzones.backends.fdb import FDBStore
from quickzones.client import Quick
from quickzones.store.kv import run
from tests.conftest import HAVE_FDB, fdb_store_url

pytestmark = pytest.mark.skipif(not HAVE_FDB, reason="needs a FoundationDB cluster")


@pytest.fixture
def store() -> Iterator[FDBStore]:
    s = FDBStore.from_url(fdb_store_url())
    yield s
    s.close()


def _binding_semaphore(binding: Any) -> Any:
    """The calling thread's semaphore of the binding's own wait (made on its first use).
    ``binding``: the ``fdb`` module the store loaded (``FDBStore.fdb``), not imported
    here: the backend alone loads the driver."""
    return getattr(binding.impl._thread_local_storage, "future_block_semaphore", None)


def test_a_consumer_thread_gets_its_values_without_the_network_thread_running_python() -> None:
    q = Quick.open(fdb_store_url())
    ran: list[Any] = []
    q.job("note")(lambda payload, ctx: ran.append(payload))
    seen: dict[str, Any] = {}

    def in_a_thread() -> None:
        ids = [q.enqueue("note", {"n": n}, app="a", tenant="t") for n in range(20)]
        seen["stored"] = [q.get("a", "t", id_) for id_ in ids]
        seen["ran"] = q.run_until_idle()
        seen["semaphore"] = _binding_semaphore(q.kv.fdb)

    t = threading.Thread(target=in_a_thread)
    t.start()
    t.join(60)
    q.close()
    assert not t.is_alive()
    assert all(item is not None and item.job_type == "note" for item in seen["stored"])
    assert seen["ran"] == 20
    assert sorted(p["n"] for p in ran) == list(range(20))
    # Every wait of that thread was one in libfdb_c: the binding's semaphore, made on the
    # first wait that goes through a callback on the network thread, was never needed.
    assert seen["semaphore"] is None


def test_a_watch_waited_in_a_thread_wakes_when_the_key_is_written(store: FDBStore) -> None:
    key = store.prefix + b"watched"
    tr = store.db.create_transaction()
    watch = tr.watch(key)
    tr.commit().wait()
    woke = threading.Event()

    def wait() -> None:
        watch.wait()
        woke.set()

    t = threading.Thread(target=wait, daemon=True)
    t.start()
    assert not woke.wait(0.3)  # nothing wrote it yet: the wait holds
    run(store, lambda tr: tr.set(b"watched", b"1"))
    assert woke.wait(30)


class _Alarm(Exception):
    pass


def test_the_main_thread_keeps_a_wait_that_a_signal_interrupts(store: FDBStore) -> None:
    assert threading.current_thread() is threading.main_thread()
    key = store.prefix + b"never-written"
    tr = store.db.create_transaction()
    watch = tr.watch(key)
    tr.commit().wait()

    def alarm(signum: int, frame: object) -> None:
        raise _Alarm

    # If the main thread waited in libfdb_c, the handler could not run until the watch
    # fired: a write 20 s from now ends that wait, and the test fails instead of hanging.
    backstop = threading.Timer(20, lambda: run(store, lambda tr: tr.set(b"never-written", b"")))
    backstop.start()
    old = signal.signal(signal.SIGALRM, alarm)
    started = time.monotonic()
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        with pytest.raises(_Alarm):
            watch.wait()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        backstop.cancel()
        watch.cancel()
    assert time.monotonic() - started < 20, "the watch fired before the signal was handled"


def test_installing_twice_wraps_the_binding_once(store: FDBStore) -> None:
    from quickzones.backends.fdb import waits

    impl = store.fdb.impl  # the binding the store loaded
    first = impl.Future.block_until_ready
    waits.install(store.fdb)
    assert impl.Future.block_until_ready is first


def test_the_simulator_is_left_as_it_is() -> None:
    from quickzones.backends.fdb import waits
    from quickzones.backends.fdb.sim import sim_module
    from quickzones.backends.memory import MemoryStore

    module = sim_module(MemoryStore.from_url("memory://"))
    waits.install(module)  # no fdb.impl there: nothing to change, no error
    assert FDBStore.from_url("fdbsim://").fdb is not None
