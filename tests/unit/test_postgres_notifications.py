"""The PostgreSQL listener for commit notifications while its server is unreachable (issue
40 point 8): ``PostgresStore._connect`` raises a storage error (translated from psycopg's),
which escaped the reading thread before: Python printed a traceback and the next wait
started another thread at once, a connection attempt and a traceback per wait."""

from __future__ import annotations

import pytest

from quickzones.backends.postgres.notifications import CommitNotifications
from quickzones.store.kv import DATABASE_LOCKED, KVError


def test_an_unreachable_server_is_retried_with_backoff_not_per_wait(
    capfd: pytest.CaptureFixture[str],
) -> None:
    attempts = 0

    def unreachable() -> object:
        nonlocal attempts
        attempts += 1
        raise KVError(DATABASE_LOCKED, "postgresql unavailable during connect: refused")

    notifications = CommitNotifications(unreachable, "s", "mine")  # type: ignore[arg-type]
    try:
        for _ in range(20):
            notifications.wait(0.01)  # each is woken at once by the failed attempt
    finally:
        notifications.close()
    assert attempts == 1, f"{attempts} connection attempts for 20 waits"
    assert notifications.failures.failures == 1  # logged once, with a count after
    assert "Traceback" not in capfd.readouterr().err
