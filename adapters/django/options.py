"""The backend's settings: ``TASKS[alias]["OPTIONS"]`` (and Django's ``ENQUEUE_ON_COMMIT``)
read once into a frozen value, every unknown or bad entry refused with an
``ImproperlyConfigured`` naming it (docs/tutorial-django.md lists them)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from quickzones.errors import InvalidArgument
from quickzones.registry import RetryPolicy
from quickzones.store.validation import check_name, check_seconds

# (task, args, kwargs) -> the tenant whose zone the task goes to.
TenantOf = Callable[[Any, tuple[Any, ...], dict[str, Any]], object]

DEFAULT_TENANT = "default"
DEFAULT_KEEP_RESULT_S = 86_400.0


@dataclass(frozen=True)
class BackendOptions:
    """``store``: quick's store URL; ``app``: the quick app the tasks' zones belong to;
    the tenant from the keyword ``tenant_kwarg`` names or from ``tenant`` (a callable or
    its dotted path), else ``default_tenant``; ``database``: Django's connection an
    enqueue joins or waits for; ``keep_result_s``: how long a finished task's status and
    return value stay readable; ``retry``: RetryPolicy fields (default one attempt, as
    Django's API expects: an exception fails the task); ``task_modules``: modules the
    worker imports besides each installed app's ``tasks``; ``quick``: keyword arguments
    for ``Quick.open``."""

    store: str
    app: str = "django"
    tenant_kwarg: str | None = None
    tenant: TenantOf | None = None
    default_tenant: str = DEFAULT_TENANT
    database: str = "default"
    enqueue_on_commit: bool = True
    keep_result_s: float = DEFAULT_KEEP_RESULT_S
    retry: RetryPolicy = field(default_factory=lambda: RetryPolicy(max_attempts=1))
    task_modules: tuple[str, ...] = ()
    quick: Mapping[str, Any] = field(default_factory=dict)


_KNOWN = set(BackendOptions.__dataclass_fields__)


def read_options(alias: str, params: Mapping[str, Any]) -> BackendOptions:
    """The backend's options from its ``TASKS`` entry, or ``ImproperlyConfigured``."""
    raw = dict(params.get("OPTIONS", {}))
    where = f"TASKS[{alias!r}]['OPTIONS']"
    unknown = sorted(set(raw) - _KNOWN)
    if unknown:
        raise ImproperlyConfigured(
            f"{where}: unknown option(s) {', '.join(map(repr, unknown))}; known: "
            + ", ".join(sorted(_KNOWN))
        )
    if "ENQUEUE_ON_COMMIT" in params:  # Django's own name for it, beside the OPTIONS
        raw.setdefault("enqueue_on_commit", params["ENQUEUE_ON_COMMIT"])
    store = raw.get("store")
    if not isinstance(store, str) or not store:
        raise ImproperlyConfigured(f"{where}['store'] must be quick's store URL")
    if raw.get("tenant") is not None and raw.get("tenant_kwarg") is not None:
        raise ImproperlyConfigured(
            f"{where}: set 'tenant' (a callable) or 'tenant_kwarg' (a keyword), not both"
        )
    try:
        return BackendOptions(
            store=store,
            app=check_name("app", raw.get("app", "django")),
            tenant_kwarg=_optional_str(where, "tenant_kwarg", raw.get("tenant_kwarg")),
            tenant=_callable(where, raw.get("tenant")),
            default_tenant=check_name("default_tenant", raw.get("default_tenant", DEFAULT_TENANT)),
            database=str(raw.get("database", "default")),
            enqueue_on_commit=_flag(where, "enqueue_on_commit", raw.get("enqueue_on_commit", True)),
            keep_result_s=check_seconds(
                "keep_result_s", raw.get("keep_result_s", DEFAULT_KEEP_RESULT_S)
            ),
            retry=RetryPolicy(**{"max_attempts": 1, **dict(raw.get("retry", {}))}),
            task_modules=tuple(raw.get("task_modules", ())),
            quick=dict(raw.get("quick", {})),
        )
    except (InvalidArgument, TypeError, ValueError) as err:
        raise ImproperlyConfigured(f"{where}: {err}") from err


def _optional_str(where: str, name: str, value: object) -> str | None:
    if value is None or (isinstance(value, str) and value.isidentifier()):
        return value
    raise ImproperlyConfigured(f"{where}[{name!r}] must be a keyword name, not {value!r}")


def _flag(where: str, name: str, value: object) -> bool:
    if isinstance(value, bool):
        return value
    raise ImproperlyConfigured(f"{where}[{name!r}] must be True or False, not {value!r}")


def _callable(where: str, value: object) -> TenantOf | None:
    if isinstance(value, str):
        try:
            value = import_string(value)
        except ImportError as err:
            raise ImproperlyConfigured(
                f"{where}['tenant']: cannot import {value!r}: {err}"
            ) from err
    if value is None or callable(value):
        return value
    raise ImproperlyConfigured(
        f"{where}['tenant'] must be a callable (task, args, kwargs) -> tenant, or its path"
    )
