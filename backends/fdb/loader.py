"""Loading the ``fdb`` binding and libfdb_c lazily, once, with one clear error.

``import fdb`` is pure Python; the C client library is loaded by ``fdb.api_version()``
(it imports ``fdb.impl``, which opens ``libfdb_c.so``). Nothing here runs at import time, so
``quick_core`` and this package import on machines without the FoundationDB client.
"""

from __future__ import annotations

import threading
from typing import Any

from quick_core.errors import ConfigurationError, MissingDependency

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
        # Not MissingDependency.__init__: its "pip install quick-queue[fdb]" hint cannot
        # install a C library, and a wrong hint is worse than none.
        ConfigurationError.__init__(self, message)
        self.package = "libfdb_c"
        self.extra = "fdb"


_lock = threading.Lock()


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
            fdb.api_version(version)
        except RuntimeError as err:
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
