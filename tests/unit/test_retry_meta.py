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
