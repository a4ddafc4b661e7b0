"""Idempotency and debounce keys through the Django tasks backend (issue 45 point 1): the
``flow_keys`` option names, per task call, the enqueue's key options; a duplicate's
``TaskResult`` is the held item's."""

from __future__ import annotations

from pathlib import Path

import pytest

from quickzones.client import Quick
from tests.unit.test_django_tasks import _django, _env

pytest.importorskip("django")


def test_a_duplicate_task_returns_the_queued_tasks_result(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'quick.db'}"
    # No 'tenant' option: a task's tenant keyword, else "default".
    flow = "shop.flow.receipts_once"
    env = _env(str(tmp_path / "app.db"), store, tmp_path, tenant=None, flow_keys=flow)
    found = _django(
        env,
        """
        from shop.tasks import note
        out["first"] = send_receipt.enqueue(1, customer="ann").id
        out["again"] = send_receipt.enqueue(1, customer="ann").id
        out["other"] = send_receipt.enqueue(2, customer="ann").id
        with transaction.atomic():  # enqueued when Django commits (ENQUEUE_ON_COMMIT)
            out["in_atomic"] = send_receipt.enqueue(3, customer="bob").id
        out["in_atomic_again"] = send_receipt.enqueue(3, customer="bob").id
        out["notes"] = [note.enqueue(text, tenant="t").id for text in ("a", "b", "c")]
        """,
    )
    assert found["again"] == found["first"] != found["other"]
    assert found["in_atomic_again"] == found["in_atomic"]
    assert len(set(found["notes"])) == 1
    q = Quick.open(store)
    try:
        assert q.zones.count(q.zone("shop", "default")) == 3  # receipts 1, 2 and 3
        [note_id] = {n.split(":", 1)[0] for n in found["notes"]}
        item = q.get("shop", "t", note_id)
        assert item is not None and b'"c"' in item.payload
    finally:
        q.close()


def test_bad_flow_keys_are_refused_naming_the_option(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'quick.db'}"
    env = _env(str(tmp_path / "app.db"), store, tmp_path, flow_keys="shop.flow.bad")
    found = _django(
        env,
        """
        try:
            send_receipt.enqueue(1, customer="ann")
        except Exception as err:
            out["err"] = [type(err).__name__, str(err)]
        """,
    )
    assert found["err"][0] in ("InvalidTaskError", "InvalidTask")
    assert "debounce.max_wait_s" in found["err"][1] and "flow_keys" in found["err"][1]


def test_a_duplicate_inside_djangos_transaction_on_the_store_is_known_at_once(
    tmp_path: Path,
) -> None:
    db = tmp_path / "one.db"
    Quick.open(f"sqlite:///{db}").close()  # quick's tables before Django's transaction
    env = _env(str(db), f"sqlite:///{db}", tmp_path, flow_keys="shop.flow.receipts_once")
    found = _django(
        env,
        """
        out["first"] = send_receipt.enqueue(5, customer="ann").id
        with transaction.atomic():  # written into Django's transaction: the answer is now
            out["again"] = send_receipt.enqueue(5, customer="ann").id
        out["joined"] = default_task_backend._joins
        """,
    )
    assert found["joined"] is True and found["again"] == found["first"]


def test_one_at_a_time_keys_from_the_flow_keys_option(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'quick.db'}"
    flow = "shop.flow.receipts_in_turn"
    env = _env(str(tmp_path / "app.db"), store, tmp_path, tenant=None, flow_keys=flow)
    found = _django(
        env,
        """
        out["ids"] = [send_receipt.enqueue(n, customer="ann").id for n in (1, 2, 3)]
        """,
    )
    assert len(set(found["ids"])) == 3
    q = Quick.open(store)
    try:
        zone = q.zone("shop", "default")
        assert q.zones.count(zone) == 3
        leased, _ = q.items.dequeue(zone, 10, 30_000)
        assert len(leased) == 1 and b"1" in leased[0].payload  # the others wait their turn
    finally:
        q.close()
