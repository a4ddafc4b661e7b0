"""``QuickTaskBackend``: Django's tasks framework over quick. Each ``@task`` call becomes a
work item in the zone (app, tenant) of quick's store, run by ``quick worker`` (see
``worker_app``), so one tenant's burst cannot starve the others (the paper's fairness).

Enqueue and Django's transactions: with ``ENQUEUE_ON_COMMIT`` (the default) a task
enqueued inside ``transaction.atomic()`` exists only if that transaction commits. When
quick's store is one of Django's databases (PostgreSQL, or one SQLite file: the alias is
derived, :mod:`~quickzones.adapters.django.databases`) the item is written *into* that
database's transaction (``Quick.enqueue_on``): rows and task commit together or not at
all, and a crash after COMMIT loses neither. Otherwise it is enqueued from the default
database's ``transaction.on_commit``. Without ``ENQUEUE_ON_COMMIT``, or outside a
transaction, it commits at once on its own."""

from __future__ import annotations

import threading
from dataclasses import replace
from datetime import datetime
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections, transaction
from django.utils import timezone

from quickzones.adapters.django.compat import (
    BaseTaskBackend,
    InvalidTask,
    TaskResult,
    TaskResultStatus,
    task_enqueued,
)
from quickzones.adapters.django.databases import store_alias
from quickzones.adapters.django.jobs import payload, register_task
from quickzones.adapters.django.options import BackendOptions, read_options
from quickzones.adapters.django.results import read_result, result_id
from quickzones.client import Quick
from quickzones.errors import InvalidArgument, OtherDatabase
from quickzones.store.flow_keys import Debounce, flow_key
from quickzones.store.validation import check_name
from quickzones.store.zones.items import new_item_id


class QuickTaskBackend(BaseTaskBackend):  # type: ignore[misc]
    """``TASKS = {"default": {"BACKEND": "quickzones.adapters.django.QuickTaskBackend",
    "OPTIONS": {"store": "postgresql://...", "app": "shop"}}}`` (every option:
    :class:`~quickzones.adapters.django.options.BackendOptions`)."""

    supports_defer = True
    supports_priority = True
    supports_get_result = True
    supports_async_task = True  # the worker runs a coroutine to completion (Task.call)

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        self.settings: BackendOptions = read_options(alias, params)
        # The Django database that is quick's store (None: none of them is).
        self.database = store_alias(self.settings.store)
        # Whether that connection reaches quick's store; None until the first enqueue
        # inside a transaction finds out.
        self._joins: bool | None = None if self.database is not None else False

    @property
    def quick(self) -> Quick:
        """The Quick of ``OPTIONS["store"]``, opened on first use (not at settings time)
        and shared by this process's threads: Django builds a backend per thread."""
        return _shared_quick(self.alias, self.settings)

    def tenant_of(self, task: Any, args: Any, kwargs: Any) -> str:
        """The tenant whose zone the task goes to (the ``tenant`` option's callable);
        InvalidTask when the callable fails or names no usable tenant."""
        try:
            tenant = self.settings.tenant(task, tuple(args), dict(kwargs))
        except Exception as err:  # the user's callable: a missing keyword, a lookup
            raise InvalidTask(
                f"task {task.name} ({task.module_path}): the backend's 'tenant' callable "
                f"found no tenant in its arguments: {type(err).__name__}: {err}"
            ) from err
        try:
            return check_name("tenant", tenant if isinstance(tenant, str) else str(tenant))
        except ValueError as err:
            raise InvalidTask(f"task {task.name}: {err}") from err

    def enqueue(self, task: Any, args: Any, kwargs: Any) -> Any:
        self.validate_task(task)
        tenant = self.tenant_of(task, args, kwargs)
        quick = self.quick
        job_type = register_task(quick, task, self.settings, self.alias)
        item_id = new_item_id(quick.ids)
        result = TaskResult(
            task=task,
            id=result_id(item_id, tenant),
            status=TaskResultStatus.READY,
            enqueued_at=timezone.now(),
            started_at=None,
            last_attempted_at=None,
            finished_at=None,
            args=args,
            kwargs=kwargs,
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )
        options: dict[str, Any] = {
            "app": self.settings.app,
            "tenant": tenant,
            "item_id": item_id,
            # Django: higher priority runs first; quick: lower numbers first.
            "priority": -int(task.priority),
            "delay": _delay_s(task.run_after),
            **self.flow_keys_of(task, args, kwargs),
        }
        if "debounce" in options:
            del options["item_id"]  # the debounced item keeps its first enqueue's id
        body = payload(task, result.args, result.kwargs)

        def announce(final: Any) -> None:
            task_enqueued.send(type(self), task_result=final)

        def as_enqueued(got: str) -> Any:
            # A duplicate or debounced enqueue answers with the held item's result.
            return result if got == item_id else replace(result, id=result_id(got, tenant))

        def enqueue_now() -> Any:
            final = as_enqueued(quick.enqueue(job_type, body, **options))
            announce(final)
            return final

        conn = connections[self.database or DEFAULT_DB_ALIAS]
        if not (self.settings.enqueue_on_commit and conn.in_atomic_block):
            return enqueue_now()
        if self._joins is not False:
            got = self._enqueue_in(conn, job_type, body, options)
            if got is not None:
                final = as_enqueued(got)
                transaction.on_commit(lambda: announce(final), using=conn.alias)
                return final
        # Enqueued when Django commits: a duplicate found then cannot change the result
        # returned now (docs/flow-control.md, Django).
        transaction.on_commit(enqueue_now, using=conn.alias)
        return result

    def flow_keys_of(self, task: Any, args: Any, kwargs: Any) -> dict[str, Any]:
        """The ``flow_keys`` option's enqueue options for this call, checked; InvalidTask
        naming the option when they are not usable."""
        of = self.settings.flow_keys
        if of is None:
            return {}
        try:
            return flow_options(of(task, tuple(args), dict(kwargs)))
        except Exception as err:  # the user's callable, or what it returned
            raise InvalidTask(
                f"task {task.name}: the backend's 'flow_keys' option: {type(err).__name__}: {err}"
            ) from err

    def _enqueue_in(
        self, conn: Any, job_type: str, body: dict[str, Any], options: dict[str, Any]
    ) -> str | None:
        """Write the item into Django's open transaction and return its id; None (nothing
        written) when quick's store turns out not to be the database Django's connection
        reaches."""
        if not hasattr(self.quick.kv, "transaction_on"):
            self._joins = False
            return None
        try:
            got = self.quick.enqueue_on(conn, job_type, body, **options)
        except OtherDatabase:
            self._joins = False
            return None
        self._joins = True
        return got

    def get_result(self, result_id: str) -> Any:
        return read_result(self.quick, self.settings.app, self.alias, result_id)


# One Quick per backend alias and settings in a process (its connection pool and store
# checks are not per thread); Quick is thread-safe.
_quicks: dict[tuple[str, str], Quick] = {}
_opening = threading.Lock()


def _shared_quick(alias: str, settings: BackendOptions) -> Quick:
    key = (alias, repr((settings.store, sorted(settings.quick.items()))))
    with _opening:
        quick = _quicks.get(key)
        if quick is None:
            quick = _quicks[key] = Quick.open(settings.store, **settings.quick)
        return quick


_FLOW_OPTIONS = ("idempotency_key", "idempotency_ttl_s", "debounce", "one_at_a_time")


def flow_options(given: object) -> dict[str, Any]:
    """What a ``flow_keys`` callable returned, as ``Quick.enqueue`` options: None or a
    dict of ``idempotency_key``, ``idempotency_ttl_s``, ``debounce`` (a
    :class:`Debounce` or a dict of its fields) and ``one_at_a_time``, checked as the
    enqueue checks them."""
    if given is None:
        return {}
    if not isinstance(given, dict):
        raise InvalidArgument("flow_keys", given, "must return None or a dict")
    unknown = sorted(set(given) - set(_FLOW_OPTIONS))
    if unknown:
        raise InvalidArgument("flow_keys", unknown, f"unknown; known: {', '.join(_FLOW_OPTIONS)}")
    out = {k: v for k, v in given.items() if v is not None}
    d = out.get("debounce")
    if isinstance(d, dict):
        out["debounce"] = Debounce(**d)
    flow_key(
        out.get("idempotency_key"),
        out.get("idempotency_ttl_s"),
        out.get("debounce"),
        item_id=None,
        delayed=False,
        after=None,
        one_at_a_time=out.get("one_at_a_time"),
    )
    return out


def _delay_s(run_after: datetime | None) -> float:
    if run_after is None:
        return 0.0
    return max(0.0, float((run_after - timezone.now()).total_seconds()))
