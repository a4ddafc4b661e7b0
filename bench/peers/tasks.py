"""The plain job function for peers that take an importable callable (RQ)."""

from __future__ import annotations

from bench.common import record_start


def job(tenant: str, enq: float, due: float, work_ms: float) -> None:
    record_start(tenant, enq, due, work_ms)
