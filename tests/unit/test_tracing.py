"""OpenTelemetry: a span per enqueue and per item run, linked across the queue."""

from __future__ import annotations

from typing import Any

import pytest

from quickzones.client import Quick
from quickzones.tracing import use_tracer_provider

otel = pytest.importorskip("opentelemetry.sdk.trace")


def test_enqueue_and_run_spans_are_linked() -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    use_tracer_provider(provider)
    try:
        q = Quick.open("memory://")
        q.job("job")(lambda payload, ctx: None)
        q.enqueue("job", {"x": 1}, app="shop", tenant="t1")
        q.run_until_idle()
    finally:
        use_tracer_provider(None)

    spans = {s.name: s for s in exporter.get_finished_spans()}
    enqueue, run = spans["quick.enqueue"], spans["quick.run"]
    assert enqueue.attributes["quick.job_type"] == "job"  # type: ignore[index]
    assert [link.context.span_id for link in run.links] == [enqueue.context.span_id]
    assert run.context.trace_id != 0
    any_span: Any = run
    assert any_span.attributes["quick.app"] == "shop"
