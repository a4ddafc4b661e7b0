"""Django's tasks framework (``django.tasks``, or ``django-tasks`` before Django 6) over
quick: ``TASKS = {"default": {"BACKEND": "quickzones.adapters.django.QuickTaskBackend",
"OPTIONS": {...}}}`` and ``quick worker --app-module quickzones.adapters.django.worker_app``
(docs/tutorial-django.md)."""

from quickzones.adapters.django.backend import QuickTaskBackend

__all__ = ["QuickTaskBackend"]
