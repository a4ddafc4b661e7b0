"""The backend's ``flow_keys`` option: a callable (task, args, kwargs) -> the enqueue's
idempotency or debounce options (docs/flow-control.md), or None."""

from typing import Any

from quickzones import Debounce


def receipts_once(
    task: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> dict[str, Any] | None:
    """One receipt per order while it is queued or running; notes debounced per tenant."""
    if task.name == "send_receipt":
        return {"idempotency_key": f"receipt-{args[0]}"}
    if task.name == "note":
        return {"debounce": Debounce("note", wait_s=60, max_wait_s=600)}
    return None


def bad(task: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    return {"debounce": {"key": "k", "wait_s": 5, "max_wait_s": 1}}


def receipts_in_turn(
    task: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> dict[str, Any] | None:
    """A customer's receipts one at a time, in the order enqueued."""
    if task.name == "send_receipt":
        return {"one_at_a_time": f"customer-{kwargs['customer']}"}
    return None
