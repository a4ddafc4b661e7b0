"""FoundationDB's tuple layer, quick's key encoding on every store, imported in this one
place.

Its import name is ``fdb``; the distribution that provides it is ``foundationdb``, a
required dependency of quickzones (its pure-Python ``fdb.tuple`` needs no ``libfdb_c``).
An environment without it gets one error that says which package to install, not a bare
``No module named 'fdb'`` from whichever module happened to import it first.
"""

from __future__ import annotations

try:
    import fdb.tuple as fdbtuple
except ImportError as err:  # pragma: no cover - a broken install
    raise ImportError(
        "quickzones encodes its keys with FoundationDB's tuple layer (import name 'fdb'), "
        "from the 'foundationdb' package, a dependency of quickzones that is missing here: "
        "pip install 'foundationdb>=7.3'"
    ) from err

__all__ = ["fdbtuple"]
