"""The documentation site builds with MkDocs in strict mode: no broken link, no page left
out of the navigation, no warning."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_mkdocs_build_strict(tmp_path: Path) -> None:
    if shutil.which("mkdocs") is None and os.environ.get("CI", "").lower() != "true":
        pytest.skip("mkdocs is not installed (pip install -e '.[dev]')")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "index.html").exists()
