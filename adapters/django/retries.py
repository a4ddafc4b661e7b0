"""Retries with backoff for Django's tasks, which Django's ``@task`` cannot express: the
backend's ``retry`` option (quick's :class:`~quickzones.registry.RetryPolicy` fields, for
every task) and ``task_retry``, the fields a task changes, by its module path.

Why a mapping in the backend's OPTIONS and not an argument of ``@task``: Django's
``@task`` takes a fixed set of arguments and its ``Task`` is a frozen dataclass the
backends only read, so a backend's own per-task settings live with the backend, keyed by
task name (as Celery's ``task_annotations``); the task's code stays the same whichever
backend ``TASKS`` names. The worker refuses a path that names no task
(:mod:`.worker_app`): a typo would otherwise leave the task on the backend's policy."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields, replace

from django.core.exceptions import ImproperlyConfigured

from quickzones.errors import InvalidArgument
from quickzones.registry import RetryPolicy
from quickzones.store.validation import check_seconds

# Django's API: an exception fails the task, so one run unless a policy says more.
DEFAULT_RETRY = RetryPolicy(max_attempts=1)
_FIELDS = tuple(f.name for f in fields(RetryPolicy))
# Counts and their least value: one run at least, no negative inline retries.
_COUNTS = {"max_attempts": 1, "max_lapses": 1, "inline_retries": 0}


def read_retry(where: str, value: object, base: RetryPolicy = DEFAULT_RETRY) -> RetryPolicy:
    """``base`` with the RetryPolicy fields of ``value`` (a dict) set, each checked;
    ImproperlyConfigured naming ``where`` and the field otherwise."""
    if not isinstance(value, Mapping):
        raise ImproperlyConfigured(
            f"{where} must be a dict of RetryPolicy fields ({', '.join(_FIELDS)}), not {value!r}"
        )
    unknown = sorted(set(value) - set(_FIELDS))
    if unknown:
        raise ImproperlyConfigured(
            f"{where}: unknown RetryPolicy field(s) {', '.join(map(repr, unknown))}; "
            f"known: {', '.join(_FIELDS)}"
        )
    checked: dict[str, object] = {}
    for name, given in value.items():
        try:
            checked[name] = _field(name, given)
        except InvalidArgument as err:
            raise ImproperlyConfigured(f"{where}: {err}") from err
    return replace(base, **checked)  # type: ignore[arg-type]


def read_task_retry(where: str, value: object, base: RetryPolicy) -> dict[str, RetryPolicy]:
    """``{task module path: policy}``: each task's fields over the backend's ``base``."""
    if not isinstance(value, Mapping):
        raise ImproperlyConfigured(
            f"{where} must map task module paths (shop.tasks.send_receipt) to RetryPolicy "
            f"fields, not {value!r}"
        )
    policies = {}
    for path, given in value.items():
        if not isinstance(path, str) or "." not in path:
            raise ImproperlyConfigured(
                f"{where}: {path!r} is not a task's module path (shop.tasks.send_receipt)"
            )
        policies[path] = read_retry(f"{where}[{path!r}]", given, base)
    return policies


def _field(name: str, value: object) -> object:
    if name in _COUNTS:
        least = _COUNTS[name]
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise InvalidArgument(name, value, f"must be a whole number, at least {least}")
        return value
    if name == "jitter":
        if not isinstance(value, bool):
            raise InvalidArgument(name, value, "must be True or False")
        return value
    if name == "max_age_s" and value is None:
        return None
    return check_seconds(name, value)
