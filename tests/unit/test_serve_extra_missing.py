"""Issue 41, point 13 (serve half): ``quick --store URL serve`` without FastAPI installed
names the extra to install, not "Drop --store" (the command that could not be loaded
stood in without a --store option, so the group took the store for one it ignores)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

# FastAPI "not installed": an import of it raises ImportError.
_PRELUDE = (
    "import sys; sys.modules['fastapi'] = None; "
    "from quickzones.cli import main; sys.argv[0] = 'quick'; main()"
)


def _quick(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _PRELUDE, *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_serve_with_store_but_without_fastapi_names_the_serve_extra(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'q.db'}"
    for args in (("--store", store, "serve"), ("serve", "--store", store)):
        done = _quick(*args)
        assert done.returncode != 0, done
        assert "pip install 'quickzones[serve]'" in done.stderr, (args, done.stderr)
        assert "Drop --store" not in done.stderr, (args, done.stderr)
        assert "Traceback" not in done.stderr, (args, done.stderr)
