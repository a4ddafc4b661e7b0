"""The contract suites ship inside the package, importable by an out-of-tree backend's own
tests, while importing quickzones itself pulls in no pytest (issue 13.9)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_importing_quickzones_imports_no_pytest() -> None:
    code = (
        "import sys, quickzones, quickzones.client, quickzones.store.enqueue, "
        "quickzones.store.zones\n"
        "assert 'pytest' not in sys.modules, 'pytest imported by quickzones'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_an_out_of_tree_backend_runs_the_shipped_suites(tmp_path: Path) -> None:
    """A third party's test module: the KV suite on its own store (here the memory store
    behind a wrapper class of its own), the zone store contract on the KV zones over it."""
    (tmp_path / "test_mystore.py").write_text(
        "import pytest\n"
        "from quickzones import Quick\n"
        "from quickzones.backends.memory import MemoryStore\n"
        "from quickzones.clock import ManualClock\n"
        "from quickzones.testing.contract.kv import *  # noqa: F403\n"
        "from quickzones.testing.contract.zonestore import *  # noqa: F403\n"
        "from quickzones.testing.contract.zonestore import ZoneStoreEnv\n"
        "\n"
        "class MyStore(MemoryStore):\n"
        "    pass\n"
        "\n"
        "@pytest.fixture\n"
        "def manual_clock():\n"
        "    return ManualClock()\n"
        "\n"
        "@pytest.fixture\n"
        "def kv_store(manual_clock):\n"
        "    return MyStore(clock=manual_clock)\n"
        "\n"
        "@pytest.fixture\n"
        "def zone_store_env(kv_store, manual_clock):\n"
        "    q = Quick(kv_store, clock=manual_clock)\n"
        "    return ZoneStoreEnv(q.items, q.kv, manual_clock)\n"
    )
    res = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_mystore.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert " passed" in res.stdout and "failed" not in res.stdout
    passed = int(res.stdout.strip().splitlines()[-1].split()[0])
    assert passed >= 60  # both suites ran, not an empty collection
