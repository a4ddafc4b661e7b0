"""The documentation's shell commands run: every ``quick ...`` command in a ```bash, ```sh or
```shell block of docs/*.md and README.md is run with the installed ``quick`` script, in page
order, in a temporary working directory per page (so ``sqlite:///quick.db`` lands there),
and must exit 0 without a traceback (issue 12 point 17: the docs' own examples failed).

Commands that need a server or run until stopped are listed in ``NOT_RUN`` with the reason;
each entry must still match a documented command, so the list cannot rot."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.docs.test_examples import FENCE

ROOT = Path(__file__).resolve().parents[2]
PAGES = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]
QUICK = Path(sys.executable).with_name("quick")
SHELLS = {"bash", "sh", "shell", "console"}

# (page, start of the command) -> why it is not run here.
NOT_RUN: dict[tuple[str, str], str] = {
    ("tutorial.md", "quick worker"): "runs until SIGTERM; needs the user's module and Redis",
    ("tutorial-sqlite-transaction.md", "quick worker"): "runs until SIGTERM; needs shop.py",
    ("tutorial-django.md", "quick worker"): (
        "runs until SIGTERM; needs the Django project (tests/unit/test_django_tutorial.py runs it)"
    ),
    ("cassandra.md", "quick cassandra init"): "needs a Cassandra cluster",
    ("cassandra.md", "quick cassandra repair"): "needs Cassandra and FoundationDB",
    ("cassandra.md", "quick migrate"): "needs Cassandra; shows optional flags in brackets",
    ("cassandra.md", "quick move-tenant"): "moves to fdb://, which needs a FoundationDB cluster",
    ("serve.md", "quick serve"): "runs until stopped (tests/serve runs it in a process)",
    ("serve.md", "quick worker"): "needs a running quick serve and the user's module",
}

_ASSIGN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


@dataclass(frozen=True)
class Command:
    page: str
    line: int
    text: str


def commands(page: Path) -> list[Command]:
    """The ``quick`` commands of a page's shell blocks, continuation lines joined and
    comments dropped; a leading ``VAR=value`` stays part of the command."""
    text = page.read_text()
    out = []
    for m in FENCE.finditer(text):
        if m["info"].strip().split(" ")[0] not in SHELLS:
            continue
        first = text.count("\n", 0, m.start()) + 2
        body = m["body"].replace("\\\n", " ")
        for offset, raw in enumerate(body.splitlines()):
            words = shlex.split(raw, comments=True)
            rest = [w for w in words if not _ASSIGN.match(w)]
            if rest and rest[0] == "quick":
                out.append(
                    Command(page.name, first + offset, " ".join(shlex.quote(w) for w in words))
                )
    return out


def _skipped(cmd: Command) -> str | None:
    for (page, start), why in NOT_RUN.items():
        if cmd.page == page and _argv(cmd)[1][0 : len(start.split())] == start.split():
            return why
    return None


def _argv(cmd: Command) -> tuple[dict[str, str], list[str]]:
    words = shlex.split(cmd.text)
    env = {}
    while words and _ASSIGN.match(words[0]):
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    return env, words


ALL = [c for p in PAGES for c in commands(p)]


def test_documented_commands_exist() -> None:
    runnable = [c for c in ALL if _skipped(c) is None]
    assert len(runnable) >= 8, runnable
    assert {c.page for c in runnable} >= {"operations.md"}
    for page, start in NOT_RUN:
        assert any(c.page == page and c.text.startswith(start) for c in ALL), (page, start)


_MODULE_FILE = re.compile(r"\A# (?P<path>[\w/]+\.py)\n")


def write_page_modules(page: str, where: Path) -> None:
    """A page's Python blocks that open with ``# name.py`` are the modules its commands
    name (``--app-module name``): written where the commands run."""
    text = (ROOT / "docs" / page).read_text() if page != "README.md" else ""
    for m in FENCE.finditer(text):
        body = textwrap.dedent(m["body"])
        named = _MODULE_FILE.match(body)
        if m["info"].strip().split(" ")[0] == "python" and named is not None:
            target = where / named["path"]
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(body)


@pytest.mark.parametrize("page", sorted({c.page for c in ALL}))
def test_shell_commands_run(page: str, tmp_path: Path) -> None:
    write_page_modules(page, tmp_path)
    for cmd in (c for c in ALL if c.page == page):
        if _skipped(cmd) is not None:
            continue
        extra, words = _argv(cmd)
        env = {k: v for k, v in os.environ.items() if k != "QUICK_STORE"}
        env.update(extra)
        proc = subprocess.run(
            [str(QUICK), *words[1:]],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        where = f"{cmd.page}:{cmd.line}: {cmd.text}"
        assert "Traceback" not in proc.stderr, f"{where}\n{proc.stderr}"
        assert proc.returncode == 0, f"{where}\nexit {proc.returncode}\n{proc.stderr}"
