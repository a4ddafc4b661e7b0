"""The app module ``quick worker`` runs for Django's tasks::

    DJANGO_SETTINGS_MODULE=mysite.settings \\
        quick worker --app-module quickzones.adapters.django.worker_app

Importing it sets Django up, finds the tasks (each installed app's ``tasks`` module, as
Celery's ``autodiscover_tasks``: a task defined elsewhere is imported there) and
registers every task of the backend as a job type of the backend's Quick, exported as
``quick``. ``QUICK_DJANGO_BACKEND`` names the backend
alias (default ``default``)."""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import django

from quickzones.errors import ConfigurationError

django.setup()

from django.apps import apps  # noqa: E402  (after setup, as Django requires)
from django.utils.module_loading import module_has_submodule  # noqa: E402

from quickzones.adapters.django.backend import QuickTaskBackend  # noqa: E402
from quickzones.adapters.django.compat import Task, task_backends  # noqa: E402
from quickzones.adapters.django.jobs import register_task  # noqa: E402
from quickzones.client import Quick  # noqa: E402


def task_modules() -> Iterator[ModuleType]:
    """Each installed app's ``tasks`` module."""
    for config in apps.get_app_configs():
        if module_has_submodule(config.module, "tasks"):
            yield importlib.import_module(f"{config.name}.tasks")


def registered(alias: str) -> Quick:
    """The backend's Quick with every task of the backend registered as a job type."""
    backend: Any = task_backends[alias]
    if not isinstance(backend, QuickTaskBackend):
        raise ConfigurationError(
            f"TASKS[{alias!r}] is {type(backend).__name__}, not QuickTaskBackend"
        )
    names = set()
    for module in task_modules():
        for value in vars(module).values():
            if isinstance(value, Task) and value.backend == alias:
                names.add(register_task(backend.quick, value, backend.settings, alias))
    unknown = sorted(set(backend.settings.task_retry) - names)
    if unknown:
        raise ConfigurationError(
            f"TASKS[{alias!r}]['OPTIONS']['task_retry'] names no task of this backend: "
            f"{', '.join(unknown)} (the tasks found: {', '.join(sorted(names)) or 'none'})"
        )
    return backend.quick


quick = registered(os.environ.get("QUICK_DJANGO_BACKEND", "default"))
