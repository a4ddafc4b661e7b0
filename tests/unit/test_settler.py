"""The settler's retry decision is the one both failure paths take (issue 40 point 7): a
consumer's Failures and a remote worker's RemoteItemOps each wrote it out before."""

from __future__ import annotations

import random

from quickzones.consumer.settler import retry_decision
from quickzones.registry import JobType, RetryPolicy


def _job(**retry: object) -> JobType:
    return JobType("job", lambda payload, ctx: None, retry=RetryPolicy(**retry))  # type: ignore[arg-type]


def test_a_failure_is_retried_with_backoff_until_its_attempts_run_out() -> None:
    job = _job(max_attempts=3, backoff_base_s=1.0, backoff_cap_s=1.0)
    rng = random.Random(1)
    # The item's error count before this failure: 0 and 1 retry, the third gives up.
    assert retry_decision(job, 0, 0, 1.0, rng, permanent=False) is not None
    assert retry_decision(job, 1, 0, 1.0, rng, permanent=False) is not None
    assert retry_decision(job, 2, 0, 1.0, rng, permanent=False) is None


def test_a_permanent_failure_or_one_past_its_age_is_dead_lettered() -> None:
    rng = random.Random(1)
    assert retry_decision(_job(), 0, 0, 1.0, rng, permanent=True) is None
    old = _job(max_age_s=60.0)
    assert retry_decision(old, 0, 0, 30.0, rng, permanent=False) is not None
    assert retry_decision(old, 0, 0, 61.0, rng, permanent=False) is None


def test_a_type_no_handler_declares_takes_the_default_policy() -> None:
    rng = random.Random(1)
    default = RetryPolicy()
    assert retry_decision(None, default.max_attempts - 1, 0, 1.0, rng, permanent=False) is None
    delay = retry_decision(None, 0, 0, 1.0, rng, permanent=False)
    assert delay is not None and 0 <= delay <= default.backoff_cap_s


def test_both_failure_paths_take_the_settlers_decision() -> None:
    # One spelling: neither path computes a backoff or a give-up of its own.
    import inspect

    from quickzones.adapters.http import worker
    from quickzones.consumer import failure

    for module in (failure, worker):
        source = inspect.getsource(module)
        assert "retry_decision(" in source, module.__name__
        assert "gives_up(" not in source and "backoff_s(" not in source, module.__name__
