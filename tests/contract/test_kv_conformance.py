"""The shipped KV conformance suite (:mod:`quickzones.testing.contract.kv`) on every backend in
``conftest.BACKENDS``; the fixtures ``kv_store`` and ``manual_clock`` come from there."""

from __future__ import annotations

from quickzones.testing.contract.kv import *  # noqa: F403 - the suite's test functions and P
