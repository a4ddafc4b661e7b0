"""What every real-FoundationDB suite in this folder shares: the repository on ``sys.path``
(plain ``pytest``, unlike ``python -m pytest``, leaves it off), and one skip, with one reason,
for all of them when no cluster can be had here (see cluster.py). With
``QUICK_REQUIRE_FDB=1`` a missing cluster is an error instead."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from integration.fdb.cluster import skip_reason  # noqa: E402

REASON = skip_reason()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if REASON is None:
        return
    skip = pytest.mark.skip(reason=REASON)
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(skip)
