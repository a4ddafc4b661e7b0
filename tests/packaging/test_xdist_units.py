"""How CI deals tests to its pytest processes (tests/xdist_units.py): whole files, and
every file that starts Cassandra on one process."""

from __future__ import annotations

from tests.xdist_units import CASSANDRA_GROUP, unit_of, uses_cassandra


def test_a_test_starts_cassandra_by_its_fixture_or_its_store_parameter() -> None:
    assert uses_cassandra("integration/x.py::test_a", ["tmp_path", "cassandra_node"])
    assert uses_cassandra("tests/contract/c.py::test_b[cassandra]", [])
    assert uses_cassandra("tests/contract/c.py::test_b[cassandra-True]", [])
    assert not uses_cassandra("tests/contract/c.py::test_b[sqlite]", [])
    # a parameter that only mentions it: a URL, a document
    assert not uses_cassandra("tests/unit/u.py::test_c[cassandra://h/ks-bad port]", [])
    assert not uses_cassandra("tests/docs/d.py::test_d[cassandra.md]", [])


def test_cassandras_files_share_one_unit_and_every_other_file_is_its_own() -> None:
    files = {"integration/a.py", "tests/contract/c.py"}
    assert unit_of("integration/a.py", files) == unit_of("tests/contract/c.py", files)
    assert unit_of("integration/a.py", files) == CASSANDRA_GROUP
    assert unit_of("tests/unit/u.py", files) == "tests/unit/u.py"
