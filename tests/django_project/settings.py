"""A tiny Django project for the tasks backend's tests (tests/unit/test_django_tasks.py).

Its database and quick's store come from the environment: ``APP_DB`` (a SQLite path, or a
``postgresql://`` URL), ``OTHER_DB`` (a second database, alias ``other``, when set),
``QUICK_STORE`` (quick's store URL), ``TASK_OPTIONS`` (JSON merged into the backend's
OPTIONS; an option set to null is left out) and ``TASK_PARAMS`` (JSON merged into the
backend's entry beside OPTIONS, as ``ENQUEUE_ON_COMMIT``)."""

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
INSTALLED_APPS = ["shop", "quickzones.adapters.django"]  # the app: manage.py quick_worker
DATABASES = {"default": _database(os.environ["APP_DB"])}
if os.environ.get("OTHER_DB"):
    DATABASES["other"] = _database(os.environ["OTHER_DB"])
_OPTIONS = {
    "store": os.environ["QUICK_STORE"],
    "app": "shop",
    "tenant": "shop.tenants.customer",
    **json.loads(os.environ.get("TASK_OPTIONS", "{}")),
}
TASKS = {
    "default": {
        "BACKEND": "quickzones.adapters.django.QuickTaskBackend",
        "OPTIONS": {name: value for name, value in _OPTIONS.items() if value is not None},
        **json.loads(os.environ.get("TASK_PARAMS", "{}")),
    }
}
