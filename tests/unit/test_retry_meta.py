"""What a failed run leaves for its retries (``JobContext.retry_meta``, issue 45 point 5:
the Django tasks backend keeps each failed run's error this way): merged into the item's
metadata by the retry's own requeue, seen by the next run in ``ctx.meta``, and kept by
the dead letter of a run that is not retried."""

from __future__ import annotations

from quickzones.client import Quick
from quickzones.clock import ManualClock
from quickzones.registry import JobContext, RetryPolicy


def test_a_failed_runs_retry_meta_reaches_the_next_run_and_the_dead_letter(
    q: Quick, clock: ManualClock
) -> None:
    seen: list[dict[str, object]] = []

    @q.job("sync", retry=RetryPolicy(max_attempts=3, backoff_base_s=1, jitter=False))
    def sync(payload: object, ctx: JobContext) -> None:
        seen.append(ctx.meta)
        tries = ctx.meta.get("tries", [])
        ctx.retry_meta["tries"] = [*tries, ctx.attempt]  # type: ignore[misc]
        raise ConnectionError(f"run {ctx.attempt}: down")

    item_id = q.enqueue("sync", b"", app="a", tenant="t")
    for _ in range(3):
        q.run_until_idle()
        clock.advance(10)

    assert seen == [{}, {"tries": [1]}, {"tries": [1, 2]}]
    letters = q.dead_letters("a", "t")
    assert [(d.item.item_id, d.item.meta.get("tries")) for d in letters if d.item] == [
        (item_id, [1, 2])  # the last run's is not retried: its error is the letter's
    ]


def test_a_handlers_meta_cannot_overwrite_quicks_own_keys(q: Quick, clock: ManualClock) -> None:
    """Keys starting with ``_`` are quick's own (a one-at-a-time key, a batch, a policy):
    a handler's ``retry_meta`` keeps its own keys and leaves those out, so the key's line
    still passes on; a ``Nack`` naming one is refused where it is raised."""
    import pytest

    from quickzones.errors import Nack

    with pytest.raises(ValueError, match=r"'_k'.*quick's own"):
        Nack(1.0, meta={"_k": "x"})
    runs: list[tuple[str, dict[str, object]]] = []

    @q.job("sync", retry=RetryPolicy(max_attempts=3, backoff_base_s=1, jitter=False))
    def sync(payload: object, ctx: JobContext) -> None:
        runs.append((str(payload), {k: v for k, v in ctx.meta.items() if not k.startswith("_")}))
        if payload == "first" and ctx.attempt == 1:
            ctx.retry_meta["_k"] = "not a key"
            ctx.retry_meta["n"] = 1
            raise ConnectionError("down")

    q.enqueue("sync", "first", app="a", tenant="t", one_at_a_time="acct")
    q.enqueue("sync", "second", app="a", tenant="t", one_at_a_time="acct")
    for _ in range(4):
        q.run_until_idle()
        clock.advance(10)
    assert runs == [("first", {}), ("first", {"n": 1}), ("second", {})]
