"""A tiny Django project for the tasks backend's tests (tests/unit/test_django_tasks.py).

Its database and quick's store come from the environment: ``APP_DB`` (a SQLite path, or a
``postgresql://`` URL), ``QUICK_STORE`` (quick's store URL) and ``TASK_OPTIONS`` (JSON
merged into the backend's OPTIONS)."""

import json
import os
from urllib.parse import urlsplit


def _database(db: str) -> dict[str, object]:
    if not db.startswith("postgresql://"):
        return {"ENGINE": "django.db.backends.sqlite3", "NAME": db}
    server = urlsplit(db)
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": server.path.lstrip("/"),
        "USER": server.username,
        "PASSWORD": server.password or "",
        "HOST": server.hostname,
        "PORT": server.port,
    }


SECRET_KEY = "tests"
USE_TZ = True
INSTALLED_APPS = ["shop"]
DATABASES = {"default": _database(os.environ["APP_DB"])}
TASKS = {
    "default": {
        "BACKEND": "quickzones.adapters.django.QuickTaskBackend",
        "OPTIONS": {
            "store": os.environ["QUICK_STORE"],
            "app": "shop",
            "tenant_kwarg": "customer",
            **json.loads(os.environ.get("TASK_OPTIONS", "{}")),
        },
    }
}
