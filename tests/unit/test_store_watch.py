"""What a consumer says while its store is away (issue 41 point 8), the StoreWatch alone
with a store whose server is away on demand and an injected clock: a WARNING at the first
failed read, naming the error; then one after 10 s, 20 s more, 40 s more (never one per
read); one INFO once it answers again. The real process and a real PostgreSQL server:
integration/postgres/test_worker_outage.py."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any, cast

import pytest

from quickzones.client import Quick
from quickzones.consumer.state import Cluster
from quickzones.consumer.store_watch import StoreWatch
from quickzones.store.kv import DATABASE_LOCKED, KVError, KVTransaction


class Away:
    """A store whose server refuses connections while ``down``."""

    def __init__(self, kv: Any) -> None:
        self.kv = kv
        self.down = False

    def create_transaction(self) -> KVTransaction:
        if self.down:
            raise KVError(DATABASE_LOCKED, "connect: Connection refused")
        return cast(KVTransaction, self.kv.create_transaction())


def test_an_outage_is_said_at_once_then_with_backoff_then_its_end(
    caplog: pytest.LogCaptureFixture,
) -> None:
    q = Quick.open("memory://")
    store = Away(q.kv)
    now = [0.0]
    toplevel = SimpleNamespace(kv=store, keys=q.toplevel.keys)
    cluster = cast(Cluster, SimpleNamespace(toplevel=toplevel))
    watch = StoreWatch({"default": cluster}, monotonic=lambda: now[0])

    def lines() -> list[tuple[int, str]]:
        return [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "quick.consumer"]

    with caplog.at_level(logging.INFO, logger="quick.consumer"):
        watch.check_once()
        assert lines() == []  # answering: nothing to say
        store.down = True
        for second in range(0, 75):  # one read a second for 75 s
            now[0] = float(second)
            watch.check_once()
        store.down = False
        now[0] = 75.0
        watch.check_once()
        watch.check_once()
    said = lines()
    levels = [level for level, _ in said]
    assert levels == [logging.WARNING] * 4 + [logging.INFO], said
    assert "lost the store of cluster 'default'" in said[0][1]
    assert "Connection refused" in said[0][1]
    assert "after 10 s" in said[1][1] and "after 30 s" in said[2][1] and "after 70 s" in said[3][1]
    assert "back after 75.0 s (75 reads failed)" in said[4][1], said[4]
    q.close()
