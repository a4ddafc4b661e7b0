"""docs/tutorial-django.md runs: its ``python no-run django file=...`` blocks are written
into a project folder, its other ``python no-run django`` blocks run there in Django
processes of their own (in page order), its ``quick worker`` command runs as a real worker
process between them, all against a fresh PostgreSQL database of the session's server."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from quickzones.testing.provision.postgres import postgres_skip_reason
from tests.docs.test_examples import DOCS, blocks
from tests.docs.test_shell_examples import commands
from tests.unit.test_postgres_tutorial import database_url  # noqa: F401  (the fixture)

pytestmark = pytest.mark.skipif(
    postgres_skip_reason() is not None, reason=str(postgres_skip_reason())
)
PAGE = DOCS / "tutorial-django.md"
SETUP = textwrap.dedent(
    """
    import json
    import django
    django.setup()
    from django.core.management import call_command
    call_command("migrate", run_syncdb=True, verbosity=0)
    """
)
# Before the page's last block: the worker runs on its own; wait for the result it reads.
WAIT = textwrap.dedent(
    """
    import time
    try:
        from django.tasks import default_task_backend as _backend
    except ImportError:
        from django_tasks import default_task_backend as _backend
    _deadline = time.monotonic() + 90
    while not _backend.get_result(paid).is_finished and time.monotonic() < _deadline:
        time.sleep(0.2)
    """
)


def _run(project: Path, env: dict[str, str], code: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=project, env=env, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_the_django_tutorial_runs(database_url: str, tmp_path: Path) -> None:  # noqa: F811
    pytest.importorskip("django")
    pytest.importorskip("django_tasks")
    scripts = []
    for block in blocks(PAGE):
        words = block.info.split()
        if words[:3] != ["python", "no-run", "django"]:
            continue
        target = next((w.removeprefix("file=") for w in words if w.startswith("file=")), None)
        if target is None:
            scripts.append(block.code)
        else:
            (tmp_path / target).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / target).write_text(block.code)
    assert len(scripts) == 2
    env = {
        **os.environ,
        "DATABASE_URL": database_url,
        "DJANGO_SETTINGS_MODULE": "mysite.settings",
        "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
    }
    placed = SETUP + scripts[0] + "\nprint(json.dumps(paid))\n"
    paid = json.loads(_run(tmp_path, env, placed).strip().splitlines()[-1])

    (worker_command,) = [c for c in commands(PAGE) if "quick worker" in c.text]
    argv = shlex.split(worker_command.text)
    assert argv[0] == "quick"
    assert f"export DJANGO_SETTINGS_MODULE={env['DJANGO_SETTINGS_MODULE']}" in PAGE.read_text()
    worker = subprocess.Popen(
        [sys.executable, "-m", "quickzones", *argv[1:]], cwd=tmp_path, env=env
    )
    try:
        code = f"import django\ndjango.setup()\npaid = {paid!r}\n" + WAIT + scripts[1]
        _run(tmp_path, env, code)
        assert worker.poll() is None
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(30)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait(10)
    # Only ann's order exists (bob's rolled back with its task), and its receipt was sent.
    check = "import django\ndjango.setup()\nfrom shop.models import Order\n" + (
        "print(list(Order.objects.values_list('email', 'receipt_sent')))"
    )
    assert _run(tmp_path, env, check).strip() == "[('ann@example.com', True)]"
