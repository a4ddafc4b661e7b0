"""One installable namespace: every repo folder that is a package is installed, under
``quickzones``, and the user-facing names import from the top."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import quickzones

ROOT = Path(__file__).resolve().parents[2]
MAPPING = {"quick_core": "quickzones", "backends": "quickzones.backends",
           "adapters": "quickzones.adapters"}  # fmt: skip


def _pyproject() -> dict[str, object]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_every_package_folder_is_listed_for_install() -> None:
    tool = _pyproject()["tool"]
    assert isinstance(tool, dict)
    listed = set(tool["setuptools"]["packages"])
    on_disk = set()
    for folder, name in MAPPING.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            on_disk.add(".".join([name, *rel.parts]))
    assert on_disk == listed


def test_curated_api_and_version() -> None:
    from quickzones import (  # noqa: F401
        AsyncQuick,
        ConsumerConfig,
        Nack,
        PermanentError,
        Quick,
        RetryPolicy,
    )

    assert set(quickzones.__all__) <= set(dir(quickzones))
    assert quickzones.__version__ and quickzones.__version__[0].isdigit()


def test_cli_version_and_short_help() -> None:
    out = subprocess.run([sys.executable, "-m", "quickzones", "--version"],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert out.strip() == f"quick, version {quickzones.__version__}"
    helped = subprocess.run([sys.executable, "-m", "quickzones", "-h"],
                            capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert "Usage:" in helped


def test_an_app_with_its_own_backends_package_can_open_sqlite(tmp_path: Path) -> None:
    # A Django-style project with its own top-level ``backends`` and ``adapters`` packages.
    for name in ("backends", "adapters"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text("MINE = True\n")
    code = (
        "import backends, adapters; assert backends.MINE and adapters.MINE;"
        "from quickzones import Quick;"
        f"q = Quick.open('sqlite:///{tmp_path / 'q.db'}');"
        "q.enqueue('job', b'x', app='a', tenant='t'); q.close()"
    )
    res = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                         text=True)  # fmt: skip
    assert res.returncode == 0, res.stderr
