"""The backend's settings: ``TASKS[alias]["OPTIONS"]`` and Django's ``ENQUEUE_ON_COMMIT``
beside them, read once into a frozen value, every unknown or bad entry refused with an
``ImproperlyConfigured`` naming it (docs/tutorial-django.md lists them). What a user could
not judge is not an option: the Django database an enqueue joins is the one that is the
store (:mod:`quickzones.adapters.django.databases`), the worker finds the tasks in each
installed app's ``tasks`` module."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from quickzones.adapters.django.retries import read_retry, read_task_retry
from quickzones.errors import InvalidArgument
from quickzones.registry import RetryPolicy
from quickzones.store.validation import check_name, check_seconds

# (task, args, kwargs) -> the tenant whose zone the task goes to.
TenantOf = Callable[[Any, tuple[Any, ...], dict[str, Any]], object]
# (task, args, kwargs) -> the enqueue's idempotency or debounce options, or None.
FlowKeysOf = Callable[[Any, tuple[Any, ...], dict[str, Any]], object]

DEFAULT_TENANT = "default"
DEFAULT_KEEP_RESULT_S = 86_400.0


def tenant_keyword(task: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> object:
    """The default ``tenant``: the task's ``tenant`` keyword when given, else
    ``"default"`` (every task in one zone, as a FIFO queue)."""
    return kwargs.get("tenant", DEFAULT_TENANT)


_TENANT = (
    "give 'tenant' a callable (task, args, kwargs) -> tenant, or its dotted path (default: "
    "the task's 'tenant' keyword, else 'default')"
)
# Options that went (issue 27 point 5), each refused with what replaced it.
_REPLACED = {
    "tenant_kwarg": _TENANT,
    "default_tenant": _TENANT,
    "database": "the Django database an enqueue joins is derived: the DATABASES alias whose "
    "NAME, HOST and PORT are the store's (the SQLite file's path), else none",
    "enqueue_on_commit": "set Django's ENQUEUE_ON_COMMIT beside OPTIONS instead",
    "task_modules": "the worker imports each installed app's tasks module: import the tasks "
    "of other modules there",
}


@dataclass(frozen=True)
class BackendOptions:
    """``store``: quick's store URL; ``app``: the quick app the tasks' zones belong to;
    ``tenant``: the callable that names a task's tenant (:func:`tenant_keyword` unless
    set); ``enqueue_on_commit``: Django's ``ENQUEUE_ON_COMMIT``; ``keep_result_s``: how
    long a finished task's status and return value stay readable; ``retry``: RetryPolicy
    fields (default one attempt, as Django's API expects: an exception fails the task);
    ``quick``: keyword arguments for ``Quick.open``; ``flow_keys``: a callable (task,
    args, kwargs) -> a dict of ``idempotency_key``, ``idempotency_ttl_s``, ``debounce``
    and ``one_at_a_time`` for that call's enqueue, or None (docs/flow-control.md)."""

    store: str
    app: str = "django"
    tenant: TenantOf = tenant_keyword
    enqueue_on_commit: bool = True
    keep_result_s: float = DEFAULT_KEEP_RESULT_S
    # ``task_retry``: each task's policy, by its module path (``retry`` with the fields
    # the task changes: :mod:`~quickzones.adapters.django.retries`).
    task_retry: Mapping[str, RetryPolicy] = field(default_factory=dict)
    retry: RetryPolicy = field(default_factory=lambda: RetryPolicy(max_attempts=1))
    quick: Mapping[str, Any] = field(default_factory=dict)
    flow_keys: FlowKeysOf | None = None


# enqueue_on_commit is Django's ENQUEUE_ON_COMMIT, beside OPTIONS, not in them.
_KNOWN = set(BackendOptions.__dataclass_fields__) - {"enqueue_on_commit"}


def read_options(alias: str, params: Mapping[str, Any]) -> BackendOptions:
    """The backend's options from its ``TASKS`` entry, or ``ImproperlyConfigured``."""
    raw = dict(params.get("OPTIONS", {}))
    where = f"TASKS[{alias!r}]['OPTIONS']"
    gone = sorted(set(raw) & set(_REPLACED))
    if gone:
        raise ImproperlyConfigured(
            f"{where}[{gone[0]!r}] is no longer an option: {_REPLACED[gone[0]]}"
        )
    unknown = sorted(set(raw) - _KNOWN)
    if unknown:
        raise ImproperlyConfigured(
            f"{where}: unknown option(s) {', '.join(map(repr, unknown))}; known: "
            + ", ".join(sorted(_KNOWN))
        )
    store = raw.get("store")
    if not isinstance(store, str) or not store:
        raise ImproperlyConfigured(f"{where}['store'] must be quick's store URL")
    retry = read_retry(f"{where}['retry']", raw.get("retry", {}))
    task_retry = read_task_retry(f"{where}['task_retry']", raw.get("task_retry", {}), retry)
    try:
        return BackendOptions(
            store=store,
            app=check_name("app", raw.get("app", "django")),
            tenant=_callable(where, raw.get("tenant", tenant_keyword)),
            flow_keys=None
            if raw.get("flow_keys") is None
            else _callable(where, raw["flow_keys"], "flow_keys"),
            enqueue_on_commit=_flag(
                f"TASKS[{alias!r}]", "ENQUEUE_ON_COMMIT", params.get("ENQUEUE_ON_COMMIT", True)
            ),
            keep_result_s=check_seconds(
                "keep_result_s", raw.get("keep_result_s", DEFAULT_KEEP_RESULT_S)
            ),
            retry=retry,
            task_retry=task_retry,
            quick=dict(raw.get("quick", {})),
        )
    except (InvalidArgument, TypeError, ValueError) as err:
        raise ImproperlyConfigured(f"{where}: {err}") from err


def retry_of(options: BackendOptions, task_path: str) -> RetryPolicy:
    """The retry policy of the task at ``task_path``: its own, else the backend's."""
    return options.task_retry.get(task_path, options.retry)


def _flag(where: str, name: str, value: object) -> bool:
    if isinstance(value, bool):
        return value
    raise ImproperlyConfigured(f"{where}[{name!r}] must be True or False, not {value!r}")


def _callable(where: str, value: object, name: str = "tenant") -> TenantOf:
    if isinstance(value, str):
        try:
            value = import_string(value)
        except ImportError as err:
            raise ImproperlyConfigured(
                f"{where}[{name!r}]: cannot import {value!r}: {err}"
            ) from err
    if callable(value):
        return value
    raise ImproperlyConfigured(
        f"{where}[{name!r}] must be a callable (task, args, kwargs) -> {name}, or its path"
    )
