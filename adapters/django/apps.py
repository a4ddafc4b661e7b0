"""The Django app ``quickzones.adapters.django``: in ``INSTALLED_APPS`` it gives a project
``python manage.py quick_worker``. It has no models: the backend works without it."""

from django.apps import AppConfig


class QuickTasksConfig(AppConfig):  # type: ignore[misc]
    name = "quickzones.adapters.django"
    # The name's last part, "django", would read as Django's own.
    label = "quickzones"
    verbose_name = "quick (Django tasks backend)"
