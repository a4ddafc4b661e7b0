"""Loading the ``fdb`` binding and libfdb_c lazily, once, with one clear error.

``import fdb`` is pure Python; the C client library is loaded by ``fdb.api_version()``
(it imports ``fdb.impl``, which opens ``libfdb_c.so``). Nothing here runs at import time, so
``quickzones`` and this package import on machines without the FoundationDB client.
"""

from __future__ import annotations

import ctypes
import os
import re
import threading
from typing import Any

from quickzones.errors import ConfigurationError, MissingDependency

CLIENT_INSTALL_HINT = (
    "install the FoundationDB client package (libfdb_c) from "
    "https://github.com/apple/foundationdb/releases, e.g. on Debian/Ubuntu "
    "`sudo apt install ./foundationdb-clients_7.3.<patch>-1_amd64.deb`, on macOS the "
    "FoundationDB-7.3.<patch>.pkg; `pip install foundationdb` installs only the Python binding"
)


class MissingFDBClient(MissingDependency):
    """libfdb_c, the FoundationDB C client library, cannot be loaded."""

    def __init__(self, detail: str = "") -> None:
        message = f"libfdb_c (the FoundationDB client library) is missing; {CLIENT_INSTALL_HINT}"
        if detail:
            message += f" (loader said: {detail})"
        # Not MissingDependency.__init__: its "pip install quickzones[fdb]" hint cannot
        # install a C library, and a wrong hint is worse than none.
        ConfigurationError.__init__(self, message)
        self.package = "libfdb_c"
        self.extra = "fdb"


_lock = threading.Lock()
_preloaded: str | None = None

# foundationdb >= 7.4 over an older libfdb_c: "The binding requires a library that supports
# API version 800, but the installed library supports a maximum version of 730."
_BINDING_TOO_NEW = re.compile(
    r"requires a library that supports API version (\d+).*maximum version of (\d+)", re.S
)


def _release(api_version: int) -> str:
    """API version 730 -> "7.3" (the FoundationDB release line that introduced it)."""
    return f"{api_version // 100}.{api_version % 100 // 10}"


def preload_library() -> None:
    """Load the libfdb_c that ``FDB_LIBRARY_PATH`` names, before the binding opens its own.

    The binding opens ``libfdb_c.so`` by name; once a library with that soname is loaded,
    the dynamic loader hands it back, so this selects a libfdb_c outside the loader's search
    path without ``LD_LIBRARY_PATH`` (which the loader reads only at process start)."""
    global _preloaded
    path = os.environ.get("FDB_LIBRARY_PATH")
    if not path or _preloaded == path:
        return
    if os.path.isdir(path):
        path = os.path.join(path, "libfdb_c.so")
    try:
        ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    except OSError as err:
        raise MissingFDBClient(f"FDB_LIBRARY_PATH={path}: {err}") from err
    _preloaded = path


def import_binding() -> Any:
    """``import fdb`` (pure Python), or MissingDependency naming the pip package."""
    try:
        import fdb
    except ImportError as err:
        raise MissingDependency("foundationdb", "fdb", "the FoundationDB Python binding") from err
    return fdb


def select_api_version(fdb: Any, version: int) -> int:
    """Call ``fdb.api_version(version)`` once per process; return the version in force.

    If the application already selected a version (the binding allows only one per
    process), that one is kept: the backend needs only features present since 610.
    """
    with _lock:
        if fdb.is_api_version_selected():
            selected: int = fdb.get_api_version()
            return selected
        try:
            preload_library()
            fdb.api_version(version)
        except RuntimeError as err:
            mismatch = _BINDING_TOO_NEW.search(str(err))
            if mismatch:
                wanted, have = (int(v) for v in mismatch.groups())
                raise ConfigurationError(
                    f"the FoundationDB Python binding (foundationdb {_release(wanted)}, API "
                    f"version {wanted}) needs a newer libfdb_c than the installed one "
                    f"(FoundationDB {_release(have)}, API version {have} at most); install "
                    f"the binding that matches the library: pip install "
                    f"'foundationdb>={_release(have)},<{_release(have + 10)}'"
                ) from err
            # e.g. "API version 730 is not supported by the installed FoundationDB C library"
            raise ConfigurationError(
                f"FoundationDB API version {version} cannot be selected: {err}; set "
                "api_version=... in the fdb:// URL to one the installed libfdb_c supports "
                "(7.1 -> 710, 7.3 -> 730)"
            ) from err
        except OSError as err:
            raise MissingFDBClient(str(err)) from err
        except Exception as err:
            # fdb.impl raises a bare Exception("Unable to locate the FoundationDB API shared
            # library!") when ctypes cannot open libfdb_c; anything else is not ours to hide.
            if "shared library" in str(err) or "libfdb_c" in str(err):
                raise MissingFDBClient(str(err)) from err
            raise
        return version
