"""Starting a real ``quick worker`` process on a handler module written into a test's
folder (the CLI suites)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def start_worker(
    tmp_path: Path, store: str, module: str, handlers: str, *args: str
) -> subprocess.Popen[bytes]:
    """``python -m quickzones worker --app-module MODULE ARGS`` in ``tmp_path``, where
    ``handlers`` is written as MODULE.py; handlers log to ``tmp_path/ran.log``
    (``QUICK_RAN_LOG``) and open ``store`` (``QUICK_STORE``)."""
    (tmp_path / f"{module}.py").write_text(handlers)
    env = {
        **os.environ,
        "QUICK_STORE": store,
        "QUICK_RAN_LOG": str(tmp_path / "ran.log"),
        "PYTHONPATH": os.getcwd(),
    }
    return subprocess.Popen(
        [sys.executable, "-m", "quickzones", "worker", "--app-module", module, *args],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
