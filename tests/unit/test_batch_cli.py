"""``quick batch show ID`` (issue 31 point 5): a batch's counts and callback, as text or
JSON, from the store a producer enqueued it into."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from quickzones import Job, RetryPolicy
from quickzones.cli import main
from quickzones.client import Quick


def test_batch_show_gives_counts_callback_and_failures(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'q.db'}"
    q = Quick.open(store)
    batch = q.enqueue_batch(
        [Job("item", n, tenant="t") for n in range(3)],
        app="a",
        callback=Job("done", None, tenant="t"),
    )

    def item(payload: int, ctx: object) -> None:
        if payload == 1:
            raise RuntimeError("one is bad")

    q.job("item", retry=RetryPolicy(max_attempts=1))(item)
    q.job("done")(lambda payload, ctx: None)
    while q.run_until_idle():
        pass
    q.close()

    out = CliRunner().invoke(main, ["--store", store, "batch", "show", batch.id, "--app", "a"])
    assert out.exit_code == 0, out.output
    assert "completed 2 of 3" in out.output and "dead-lettered 1" in out.output
    assert batch.callback_id in out.output and "one is bad" in out.output

    out = CliRunner().invoke(
        main, ["--store", store, "batch", "show", batch.id, "--app", "a", "--json"]
    )
    doc = json.loads(out.output)
    assert (doc["total"], doc["completed"], doc["dead_lettered"], doc["state"]) == (3, 2, 1, "done")
    assert doc["failed"][0]["item_id"] == batch.item_ids[1]

    out = CliRunner().invoke(main, ["--store", store, "batch", "show", "nope", "--app", "a"])
    assert out.exit_code == 1 and "no batch 'nope' in app a" in out.output
