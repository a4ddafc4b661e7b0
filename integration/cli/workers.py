"""Starting a real ``quick worker`` process on a handler module written into a test's
folder (the CLI suites)."""

from __future__ import annotations

import os
import signal
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


def stop_worker(proc: subprocess.Popen[bytes], timeout_s: float = 60.0) -> bytes:
    """SIGTERM (a graceful stop) unless it already exited; SIGKILL if it has not stopped
    within ``timeout_s``. Returns what it wrote to stderr."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
    return err or b""
