"""Which commits may return before the store has made them durable
(``kv.relax_durability``; PostgreSQL: ``synchronous_commit = off`` for that transaction):
a consumer's visit and an enqueue's part two, whose loss in a crash of the store's
server only makes items run again or vest later; never an enqueue's part one nor a
completion. A store passed in records each writing commit and whether it was relaxed."""

from __future__ import annotations

from typing import Any

from quickzones.backends.memory import MemoryStore
from quickzones.client import Quick
from quickzones.store.kv import KVStore, KVTransaction
from quickzones.store.records import ZoneId


class _Recorded:
    def __init__(self, tr: KVTransaction, store: RecordingStore) -> None:
        self._tr = tr
        self._store = store
        self._relaxed = False
        self._wrote = False

    def relax_durability(self) -> None:
        self._relaxed = True

    def set(self, key: bytes, value: bytes) -> None:
        self._wrote = True
        self._tr.set(key, value)

    def clear(self, key: bytes) -> None:
        self._wrote = True
        self._tr.clear(key)

    def clear_range(self, begin: bytes, end: bytes) -> None:
        self._wrote = True
        self._tr.clear_range(begin, end)

    def commit(self) -> None:
        at = len(self._store.commits)  # before what follows this commit (part two)
        self._tr.commit()
        if self._wrote:
            self._store.commits.insert(at, self._relaxed)

    def reset(self) -> None:
        self._relaxed = self._wrote = False
        self._tr.reset()

    def on_error(self, error: Any) -> None:
        self._relaxed = self._wrote = False
        self._tr.on_error(error)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tr, name)


class RecordingStore:
    """Each writing commit, in order: True where it was relaxed."""

    def __init__(self, store: KVStore) -> None:
        self._store = store
        self.url = store.url
        self.commits: list[bool] = []

    def create_transaction(self) -> KVTransaction:
        return _Recorded(self._store.create_transaction(), self)  # type: ignore[return-value]

    def close(self) -> None:
        self._store.close()


def _quick() -> tuple[Quick, RecordingStore]:
    store = RecordingStore(MemoryStore())
    q = Quick(store)  # type: ignore[arg-type]
    return q, store


def test_an_enqueue_is_durable_and_its_part_two_relaxed() -> None:
    q, store = _quick()

    @q.job("remind")
    def remind(payload: object, ctx: object) -> None:
        return None

    q.enqueue("remind", {"later": True}, app="a", tenant="t", delay=3600)
    store.commits.clear()
    q.enqueue("remind", {"now": True}, app="a", tenant="t")  # the pointer vests in an hour
    assert store.commits == [False, True]  # part one durable; part two's pull relaxed
    pointer = q.toplevel.get_pointer(ZoneId("a", "t"))
    assert pointer is not None and pointer.vesting_ms <= q.clock.now() * 1000 + 1


def test_a_visit_is_relaxed_and_the_completion_durable() -> None:
    q, store = _quick()
    before_start: list[list[bool]] = []

    @q.job("ship")
    def ship(payload: object, ctx: object) -> None:
        before_start.append(list(store.commits))

    q.enqueue("ship", {}, app="a", tenant="t")
    assert q.run_until_idle() == 1  # warm: the scanner's lease, the clock's floor
    store.commits.clear()
    q.enqueue("ship", {}, app="a", tenant="t")
    enqueued = len(store.commits)
    assert q.run_until_idle() == 1
    assert before_start[-1][enqueued:], "no commit between the enqueue and the start"
    assert all(before_start[-1][enqueued:])  # the visit: relaxed
    assert store.commits[-1] is False  # the completion: durable
    assert store.commits[0] is False  # part one (part two pulled the idle pointer: relaxed)
