"""RepeatedFailure: a failure repeating many times a second is logged once per interval
with a count, and once when it ends; backoff is capped (issue 28 points 5 and 13)."""

from __future__ import annotations

import logging

import pytest

from quickzones.repeated_failure import RepeatedFailure, backoff


def test_a_thousand_failures_make_three_records_with_their_counts(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    failures = RepeatedFailure(
        logging.getLogger("test.repeated"), "visits", interval_s=10, monotonic=lambda: now[0]
    )
    caplog.set_level(logging.WARNING, "test.repeated")
    for n in range(1000):  # 100 a second for 10 s
        now[0] = n / 100
        assert failures.failed(OSError("disk full")) == n + 1
    now[0] = 10.0
    failures.failed(OSError("disk full"))
    failures.succeeded()
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 3, messages
    assert messages[0].startswith("visits failed: OSError: disk full")
    assert "failed 1000 times in the last 10 s (1001 in a row)" in messages[1]
    assert messages[2].startswith("visits succeed again after 1001 failures in a row")
    failures.succeeded()  # nothing to end: nothing said
    assert len(caplog.records) == 3


def test_backoff_grows_and_is_capped() -> None:
    assert all(0 <= backoff(1, base_s=0.05) <= 0.1 for _ in range(100))
    assert all(0 <= backoff(10_000) <= 5.0 for _ in range(100))
