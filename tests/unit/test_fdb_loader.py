"""Loading the FoundationDB binding: a binding newer than libfdb_c gets an error naming both
versions and the pip command that fixes it (issue 14)."""

from __future__ import annotations

import ctypes.util
import os
import subprocess
import sys
from typing import Any

import pytest

from quickzones.backends.fdb import FDBOptions, FDBStore
from quickzones.backends.fdb.sim import sim_module
from quickzones.errors import ConfigurationError
from quickzones.testing.provision import find_fdb_dist


class _Binding80Over73:
    """What ``foundationdb`` 8.0.0's ``api_version`` does over a 7.3 libfdb_c."""

    FDBError = Exception

    def __init__(self) -> None:
        self.inner = sim_module()

    def is_api_version_selected(self) -> bool:
        return False

    def api_version(self, version: int) -> None:
        raise RuntimeError(
            "This version of the FoundationDB Python binding is not supported by the installed "
            "FoundationDB C library. The binding requires a library that supports API version "
            "800, but the installed library supports a maximum version of 730."
        )

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_binding_newer_than_the_library_names_both_versions() -> None:
    with pytest.raises(ConfigurationError) as info:
        FDBStore(FDBOptions(), fdb_module=_Binding80Over73())
    message = str(info.value)
    assert "8.0" in message and "7.3" in message
    assert "pip install 'foundationdb>=7.3,<7.4'" in message
    # Not the advice for a too-high api_version= in the URL: that would not help.
    assert "api_version=" not in message


MISSING_LIBRARY = """
from quickzones.backends.fdb import MissingFDBClient
from quickzones.urls import open_kv
try:
    open_kv("fdb://")
except MissingFDBClient as err:
    assert "libfdb_c" in str(err) and "github.com/apple/foundationdb/releases" in str(err)
    print("MissingFDBClient")
"""


@pytest.mark.skipif(
    ctypes.util.find_library("fdb_c") is not None, reason="libfdb_c is installed system-wide"
)
def test_missing_library_error_in_a_process_without_libfdb_c() -> None:
    # A fresh process with no FDB_LIBRARY_PATH/LD_LIBRARY_PATH: this process may have loaded
    # a test build's libfdb_c already (the real-fdb suites), which the binding cannot unload.
    env = {k: v for k, v in os.environ.items() if k not in ("FDB_LIBRARY_PATH", "LD_LIBRARY_PATH")}
    out = subprocess.run(
        [sys.executable, "-c", MISSING_LIBRARY], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.stdout.strip() == "MissingFDBClient", out.stderr


def test_fdb_library_path_selects_the_client_library() -> None:
    dist = find_fdb_dist()
    if dist is None or dist.libfdb_c is None:
        pytest.skip("no FoundationDB build with a libfdb_c here")
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    env["FDB_LIBRARY_PATH"] = dist.libfdb_c
    code = "import fdb; from quickzones.backends.fdb import FDBStore; FDBStore.from_url('fdb://')"
    # Opening needs no running cluster: fdb.open only reads the (absent) file lazily.
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=60)  # fmt: skip
    assert out.returncode == 0, out.stderr


NEWER_BINDING = """
import fdb
fdb.LATEST_API_VERSION = 800  # what foundationdb 8.0 declares
from quickzones.testing.provision import fdb_skip_reason
print(fdb_skip_reason())
"""


def test_a_build_with_a_too_new_binding_skips_with_the_fix() -> None:
    # A checkout with ../shared/fdb but `pip install -e .[dev]` (foundationdb 8.0): one
    # line saying what to install, not a hundred failures.
    dist = find_fdb_dist()
    if dist is None or dist.libfdb_c is None:
        pytest.skip("no FoundationDB build with a libfdb_c here")
    drop = ("QUICK_REQUIRE_FDB", "FDB_CLUSTER_FILE")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    out = subprocess.run([sys.executable, "-c", NEWER_BINDING], env=env, capture_output=True,
                         text=True, timeout=60)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "pip install 'foundationdb>=7.3,<7.4'" in out.stdout
    env["QUICK_REQUIRE_FDB"] = "1"
    out = subprocess.run([sys.executable, "-c", NEWER_BINDING], env=env, capture_output=True,
                         text=True, timeout=60)  # fmt: skip
    assert out.returncode != 0 and "foundationdb>=7.3,<7.4" in out.stderr
