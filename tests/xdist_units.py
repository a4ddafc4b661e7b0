"""pytest plugin for CI's ``--dist loadgroup`` (scripts/test): how tests are dealt to the
pytest-xdist processes.

Each file stays whole on one process, as with ``--dist loadfile`` (a module's fixtures and
order hold), and the files that start a Cassandra node go to one process together: each
process starts its own node (a JVM, about 20 s of two cores' time and a gigabyte of
memory), and three processes started three in every CI run.
"""

from __future__ import annotations

from collections.abc import Iterable

import pytest

# A file is Cassandra's where one of its tests uses this fixture, or has a parameter named
# so (the contract suites pick their store by a parameter, whose fixture asks for the node
# only as it runs).
CASSANDRA_FIXTURE = "cassandra_node"
CASSANDRA_GROUP = "cassandra"


def uses_cassandra(nodeid: str, fixturenames: Iterable[str]) -> bool:
    """Whether the test ``nodeid`` starts the session's Cassandra node."""
    if CASSANDRA_FIXTURE in fixturenames:
        return True
    params = nodeid.partition("[")[2].rstrip("]")
    return CASSANDRA_GROUP in params.split("-")


def unit_of(path: str, cassandra_files: set[str]) -> str:
    """The group a test of the file at ``path`` (relative to the root) is dealt with."""
    return CASSANDRA_GROUP if path in cassandra_files else path


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Before pytest-xdist's own hook, which reads these marks into the nodes' ids.
    if config.getoption("dist", None) != "loadgroup":
        return
    cassandra_files = {
        item.nodeid.split("::")[0]
        for item in items
        if uses_cassandra(item.nodeid, getattr(item, "fixturenames", ()))
    }
    for item in items:
        path = item.nodeid.split("::")[0]
        item.add_marker(pytest.mark.xdist_group(unit_of(path, cassandra_files)))
