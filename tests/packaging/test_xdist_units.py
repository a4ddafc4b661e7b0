"""How CI deals tests to its pytest processes (tests/xdist_units.py): whole files, and
every file that may start Cassandra in one unit."""

from __future__ import annotations

import pytest

from tests.xdist_units import cassandra_files, uses_cassandra


def test_a_test_may_start_cassandra_by_its_file_or_its_store_parameter() -> None:
    assert uses_cassandra("integration/cassandra_adapter/test_migrate.py::test_a")
    assert uses_cassandra("integration/fdb/test_fdb_cassandra_pointers.py::test_b")
    assert uses_cassandra("tests/contract/c.py::test_b[cassandra]")
    assert uses_cassandra("tests/contract/c.py::test_b[cassandra-True]")
    assert not uses_cassandra("tests/contract/c.py::test_b[sqlite]")
    # a parameter that only mentions it: a URL, a document
    assert not uses_cassandra("tests/unit/u.py::test_c[cassandra://h/ks-bad port]")
    assert not uses_cassandra("tests/docs/d.py::test_d[cassandra.md]")


def test_a_file_with_one_cassandra_test_goes_whole_to_its_unit() -> None:
    ids = [
        "tests/contract/c.py::test_b[sqlite]",
        "tests/contract/c.py::test_b[cassandra]",
        "tests/unit/u.py::test_c",
        "integration/test_cassandra_local.py::test_d",
    ]
    assert cassandra_files(ids) == {"tests/contract/c.py", "integration/test_cassandra_local.py"}


def test_without_pytest_xdist_the_hook_leaves_the_dealing_to_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The module and its scheduler hook need pytest-xdist only where it runs them: with
    ``xdist`` not importable the scheduler is None (pytest-xdist's own ``loadfile``)."""
    import sys

    from tests.xdist_units import files_and_one_cassandra

    for name in [m for m in sys.modules if m == "xdist" or m.startswith("xdist.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "xdist", None)  # import xdist -> ImportError
    monkeypatch.setitem(sys.modules, "xdist.scheduler", None)
    assert files_and_one_cassandra(None, None) is None  # type: ignore[arg-type]
