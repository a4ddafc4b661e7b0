"""A handler's own metadata (``Nack(meta=...)``, ``JobContext.retry_meta``, a remote
worker's nack ``meta``), merged into its item's metadata for the next run. Keys starting
with ``_`` are quick's own there (a one-at-a-time key, a batch, a type policy, progress):
one written by a handler would undo what quick keeps, so the same rule refuses them on
every path."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

RESERVED_PREFIX = "_"


def meta_key_problem(key: object) -> str | None:
    """Why ``key`` cannot be a key of a handler's metadata, or None."""
    if not isinstance(key, str):
        return f"key {key!r}: keys must be strings"
    if not key:
        return "a key must not be empty"
    if key.startswith(RESERVED_PREFIX):
        return f"key {key[:50]!r}: keys starting with {RESERVED_PREFIX!r} are quick's own"
    return None


def check_handler_meta(meta: Mapping[Any, Any]) -> None:
    """Raise ValueError naming the first key a handler may not set."""
    for key in meta:
        problem = meta_key_problem(key)
        if problem is not None:
            raise ValueError(problem)


def handler_keys(meta: Mapping[Any, Any]) -> tuple[dict[str, object], list[str]]:
    """``meta`` without the keys a handler may not set, and those keys' problems (where a
    bad key can no longer be refused to its writer: a failed run's ``retry_meta``)."""
    kept: dict[str, object] = {}
    problems: list[str] = []
    for key, value in meta.items():
        problem = meta_key_problem(key)
        if problem is None:
            kept[str(key)] = value
        else:
            problems.append(problem)
    return kept, problems
