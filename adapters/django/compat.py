"""Django's tasks framework, wherever this Django has it: ``django.tasks`` (Django 6), or
``django_tasks`` (its reference implementation, the same API, for Django 4.2 to 5.2).
Every other module of the adapter imports the framework from here."""

from __future__ import annotations

from typing import Any

try:  # Django 6
    from django.tasks import (  # type: ignore[import-not-found,unused-ignore]
        TaskContext,
        TaskResult,
        TaskResultStatus,
        task_backends,
    )
    from django.tasks import exceptions as _exceptions  # type: ignore[import-not-found,unused-ignore]
    from django.tasks.backends.base import (  # type: ignore[import-not-found,unused-ignore]
        BaseTaskBackend,
    )
    from django.tasks.base import Task, TaskError  # type: ignore[import-not-found,unused-ignore]
    from django.tasks.signals import (  # type: ignore[import-not-found,unused-ignore]
        task_enqueued,
        task_finished,
        task_started,
    )

    try:  # Django 6.0
        from django.tasks.utils import (  # type: ignore[import-not-found,unused-ignore]
            get_exception_traceback,
            normalize_json,
        )
    except ImportError:  # Django 6.1 moved normalize_json and dropped the other
        from django.utils.json import (  # type: ignore[import-not-found,unused-ignore]
            normalize_json,
        )

        def get_exception_traceback(exc: BaseException) -> str:
            """The traceback as Django 6.1's own backends keep it."""
            import traceback

            return "".join(traceback.format_exception(exc))

except ImportError:
    from django_tasks import TaskContext, TaskResult, TaskResultStatus, task_backends
    from django_tasks import exceptions as _exceptions
    from django_tasks.backends.base import BaseTaskBackend
    from django_tasks.base import Task, TaskError
    from django_tasks.signals import task_enqueued, task_finished, task_started
    from django_tasks.utils import get_exception_traceback, normalize_json

# Django 6 renamed django-tasks' InvalidTaskError to InvalidTask.
_names = vars(_exceptions)
InvalidTask: type[Exception] = _names.get("InvalidTask") or _names["InvalidTaskError"]
TaskResultDoesNotExist: type[Exception] = _exceptions.TaskResultDoesNotExist


def set_field(result: Any, name: str, value: object) -> None:
    """TaskResult is a frozen dataclass the backend fills in, as Django's own backends do."""
    object.__setattr__(result, name, value)


__all__ = [
    "BaseTaskBackend",
    "InvalidTask",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultStatus",
    "get_exception_traceback",
    "normalize_json",
    "set_field",
    "task_backends",
    "task_enqueued",
    "task_finished",
    "task_started",
]
