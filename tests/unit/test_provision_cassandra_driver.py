"""Provisioning a Cassandra node for tests without the optional driver installed says
which extra to install, instead of a bare ``ModuleNotFoundError``."""

from __future__ import annotations

import sys

import pytest

from quickzones.errors import MissingDependency
from quickzones.testing.provision.cassandra import CassandraEndpoint


def test_a_cluster_without_cassandra_driver_names_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "cassandra", None)  # as on a machine without it
    monkeypatch.setitem(sys.modules, "cassandra.cluster", None)
    with pytest.raises(MissingDependency, match=r"pip install 'quickzones\[cassandra\]'"):
        CassandraEndpoint(("127.0.0.1",), 9042).cluster()
