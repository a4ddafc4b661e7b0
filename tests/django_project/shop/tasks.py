"""The shop's tasks: each takes its tenant as the ``customer`` keyword (the settings'
``tenant`` callable reads it), but ``note``, whose tenant is the backend's default: its
``tenant`` keyword, else "default". The worker finds each installed app's ``tasks``
module, so the async task another module defines is imported here."""

import os
import time

from shop.async_tasks import total

try:
    from django.tasks import TaskContext, task  # type: ignore[import-not-found,unused-ignore]
except ImportError:  # Django before 6: the reference implementation
    from django_tasks import TaskContext, task


@task(priority=10)
def send_receipt(order: int, *, customer: str) -> dict[str, object]:
    with open(os.environ["RUN_LOG"], "a") as log:
        log.write(f"{customer} {order}\n")
    return {"order": order, "sent_to": customer}


@task(takes_context=True)
def refund(context: TaskContext, order: int, *, customer: str) -> None:
    raise ValueError(f"order {order} was never paid (attempt {context.attempt})")


@task(takes_context=True)
def flaky(context: TaskContext, *, customer: str) -> int:
    """Fails until its third run (the backend's ``task_retry`` gives it three)."""
    with open(os.environ["RUN_LOG"], "a") as log:
        log.write(f"flaky {context.attempt} {time.time()!r}\n")
    if context.attempt < 3:
        raise ConnectionError(f"run {context.attempt}: the mail server is down")
    return int(context.attempt)


@task
def slow(*, customer: str) -> str:
    """Runs until the file ``go`` beside the run log exists (a task seen RUNNING)."""
    go = os.path.join(os.path.dirname(os.environ["RUN_LOG"]), "go")
    with open(os.environ["RUN_LOG"], "a") as log:
        log.write(f"slow {time.time()!r}\n")
    while not os.path.exists(go):
        time.sleep(0.05)
    return "done"


@task
def note(text: str, *, tenant: str = "") -> str:
    return text


__all__ = ["flaky", "note", "refund", "send_receipt", "slow", "total"]
