"""pytest plugin for CI's ``-n N --dist loadfile`` (scripts/test): how tests are dealt to
the pytest-xdist processes.

Each file stays whole on one process, as ``loadfile`` deals them (a module's fixtures
and order hold), and the files that start a Cassandra node go to one process together:
each process starts its own node (a JVM, about 20 s of two cores' time and most of a
gigabyte), and three processes started three in every CI run. (``--dist loadgroup`` with
``xdist_group`` marks would say the same, but pytest-xdist 3.8 marks a group in a node id
field pytest 9.2 no longer reads: pytest-dev/pytest-xdist#1386.)
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest

CASSANDRA_UNIT = "cassandra"


def file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def uses_cassandra(nodeid: str) -> bool:
    """Whether the test ``nodeid`` may start the session's Cassandra node: its file names
    Cassandra (the adapter's suites, the local node's, the FoundationDB pointers beside
    Cassandra items; a few small unit files too), or it has a parameter named so (the
    contract suites pick their store by one)."""
    if "cassandra" in file_of(nodeid).lower():
        return True
    params = nodeid.partition("[")[2].rstrip("]")
    return CASSANDRA_UNIT in params.split("-")


def cassandra_files(nodeids: Iterable[str]) -> set[str]:
    return {file_of(nodeid) for nodeid in nodeids if uses_cassandra(nodeid)}


def files_and_one_cassandra(config: pytest.Config, log: Any) -> Any:
    """``loadfile``'s scheduler, with every Cassandra file in one unit; None where
    pytest-xdist (module ``xdist``, the ``pytest-xdist`` distribution of the ``dev``
    extra) cannot be imported: pytest-xdist then deals with its own ``loadfile``. Imported
    only here, when a run deals tests to processes: this module, and what tests it, import
    without it."""
    try:
        from xdist.scheduler import LoadFileScheduling
    except ImportError:
        return None

    class FilesAndOneCassandra(LoadFileScheduling):
        _cassandra: set[str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self._cassandra is None:
                self._cassandra = cassandra_files(self.collection or ())
            path = file_of(nodeid)
            return CASSANDRA_UNIT if path in self._cassandra else path

    return FilesAndOneCassandra(config, log)


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    # Called by pytest-xdist only, so it is installed whenever this runs.
    if config.getoption("dist", None) != "loadfile":
        return None
    return files_and_one_cassandra(config, log)
