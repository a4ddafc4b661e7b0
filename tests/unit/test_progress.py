"""Progress from a handler (issue 31 point 4), from the user's side: ``ctx.progress``
reported while an item runs is readable in ``Quick.status()`` and kept with the status
record after completion; bad values are refused; writes are throttled, the last one kept."""

from __future__ import annotations

import threading

import pytest

from quickzones.client import Quick
from quickzones.consumer import ConsumerConfig
from quickzones.consumer.progress import ProgressReporter
from quickzones.errors import InvalidArgument
from quickzones.registry import JobContext
from tests.waiting import wait_for


def test_progress_is_readable_while_running_and_kept_after_completion(q: Quick) -> None:
    reported = threading.Event()
    release = threading.Event()

    @q.job("export", keep_status_s=3600)
    def export(payload: object, ctx: JobContext) -> None:
        ctx.progress(0.25, "rows 1-250")
        reported.set()
        release.wait(30)
        ctx.progress(1.0, "done")

    item_id = q.enqueue("export", b"", app="a", tenant="t")
    assert q.status("a", "t", item_id).progress is None  # type: ignore[union-attr]
    consumer = q.consumer(ConsumerConfig(workers=1, in_order=True))
    consumer.start()
    try:
        assert reported.wait(30)
        status = q.status("a", "t", item_id)
        assert status is not None and status.state == "leased"
        assert (status.progress, status.progress_note) == (0.25, "rows 1-250")
        release.set()
        assert wait_for(lambda: q.status("a", "t", item_id).state == "completed", 30)  # type: ignore[union-attr]
    finally:
        release.set()
        consumer.stop()
    done = q.status("a", "t", item_id)
    assert done is not None and (done.progress, done.progress_note) == (1.0, "done")


def test_a_transactional_handlers_progress_is_kept_with_its_completion(q: Quick) -> None:
    if not q.capabilities.transactional_handlers:
        pytest.skip("no transactional handlers")

    @q.job("tx", transactional=True, keep_status_s=3600)
    def tx(payload: object, ctx: JobContext) -> None:
        ctx.progress(0.5)
        ctx.progress(0.9, "almost")

    item_id = q.enqueue("tx", b"", app="a", tenant="t")
    q.run_until_idle()
    done = q.status("a", "t", item_id)
    assert done is not None and done.state == "completed"
    assert (done.progress, done.progress_note) == (0.9, "almost")


@pytest.mark.parametrize(
    ("fraction", "note", "message"),
    [
        (1.5, None, "between 0 and 1"),
        (-0.1, None, "between 0 and 1"),
        (float("nan"), None, "between 0 and 1"),
        ("half", None, "a number"),
        (True, None, "a number"),
        (0.5, 7, "text"),
        (0.5, "x" * 501, "longer than 500"),
    ],
)
def test_bad_progress_is_refused_in_the_handler_and_stores_nothing(
    q: Quick, fraction: object, note: object, message: str
) -> None:
    errors: list[str] = []

    @q.job("j", keep_status_s=3600)
    def j(payload: object, ctx: JobContext) -> None:
        try:
            ctx.progress(fraction, note)  # type: ignore[arg-type]
        except InvalidArgument as err:
            errors.append(str(err))

    item_id = q.enqueue("j", b"", app="a", tenant="t")
    q.run_until_idle()
    assert len(errors) == 1 and message in errors[0], errors
    done = q.status("a", "t", item_id)
    assert done is not None and done.state == "completed" and done.progress is None


class _Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_writes_are_throttled_to_one_per_half_second_and_the_last_is_kept() -> None:
    written: list[tuple[float, str | None]] = []
    clock = _Clock()
    reporter = ProgressReporter(lambda f, n: written.append((f, n)), monotonic=clock, timer=None)
    for i in range(100):  # 100 reports within 0.1 s
        reporter.report(i / 100, f"step {i}")
        clock.t += 0.001
    assert written == [(0.0, "step 0")]
    clock.t = 0.6
    reporter.report(0.995, None)  # half a second after the last write: written at once
    assert written[-1] == (0.995, None) and len(written) == 2
    reporter.report(0.999, "last")  # throttled ...
    reporter.close()  # ... and kept when the handler returns
    assert written[-1] == (0.999, "last") and len(written) == 3
