"""Starting a real ``quick worker`` process, or a consumer process configured from Python,
on a handler module written into a test's folder (the CLI suites)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any


def start_worker(
    tmp_path: Path, store: str, module: str, handlers: str, *args: str
) -> subprocess.Popen[bytes]:
    """``python -m quickzones worker --app-module MODULE ARGS`` in ``tmp_path``, where
    ``handlers`` is written as MODULE.py; handlers log to ``tmp_path/ran.log``
    (``QUICK_RAN_LOG``) and open ``store`` (``QUICK_STORE``)."""
    argv = ["-m", "quickzones", "worker", "--app-module", module, *args]
    return _start(tmp_path, store, module, handlers, argv)


# A consumer run from Python, as a user sets the ConsumerConfig fields `quick worker` has no
# option for: the same Consumer.run_forever() (SIGTERM/SIGINT stop it gracefully).
_CONSUMER = (
    "import json, sys\n"
    "sys.path.insert(0, '.')\n"
    "from quickzones.consumer import ConsumerConfig\n"
    "module = __import__(sys.argv[1])\n"
    "config = ConsumerConfig(**json.loads(sys.argv[2]))\n"
    "module.quick.consumer(config).run_forever()\n"
)


def start_consumer(
    tmp_path: Path, store: str, module: str, handlers: str, **config: Any
) -> subprocess.Popen[bytes]:
    """A consumer process over MODULE's ``quick``, as ``start_worker`` but configured with
    ``ConsumerConfig(**config)`` from Python."""
    return _start(tmp_path, store, module, handlers, ["-c", _CONSUMER, module, json.dumps(config)])


def _start(
    tmp_path: Path, store: str, module: str, handlers: str, argv: list[str]
) -> subprocess.Popen[bytes]:
    (tmp_path / f"{module}.py").write_text(handlers)
    env = {
        **os.environ,
        "QUICK_STORE": store,
        "QUICK_RAN_LOG": str(tmp_path / "ran.log"),
        "PYTHONPATH": os.getcwd(),
    }
    return subprocess.Popen(
        [sys.executable, *argv],
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
