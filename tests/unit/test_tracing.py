"""OpenTelemetry: a span per enqueue and per item run, linked across the queue."""

from __future__ import annotations

from typing import Any

import pytest

from quickzones.client import Quick
from quickzones.tracing import use_tracer_provider

# The SDK (opentelemetry-sdk, the dev extra; the API is the tracing extra) only through
# its guard.
otel = pytest.importorskip("opentelemetry.sdk.trace")
TracerProvider = otel.TracerProvider
SimpleSpanProcessor = pytest.importorskip("opentelemetry.sdk.trace.export").SimpleSpanProcessor
InMemorySpanExporter = pytest.importorskip(
    "opentelemetry.sdk.trace.export.in_memory_span_exporter"
).InMemorySpanExporter


def test_enqueue_and_run_spans_are_linked() -> None:
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


def _python(code: str) -> str:
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_process_that_traces_nothing_never_imports_opentelemetry() -> None:
    """Importing it (with its propagators' entry points) was paid at every start-up of
    every process, whether it traced or not (20-30 ms of a 0.4 s import)."""
    out = _python(
        "import sys, quickzones, quickzones.cli, quickzones.consumer.runtime\n"
        "from quickzones import Quick\n"
        "q = Quick.open('memory://'); q.job('job')(lambda p, c: None)\n"
        "q.enqueue('job', {}, app='a', tenant='t'); q.run_until_idle()\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))\n"
    )
    assert out.strip() == "[]"


def test_the_global_provider_an_application_sets_still_traces() -> None:
    """The usual set-up (``trace.set_tracer_provider``), made after quick was imported."""
    out = _python(
        "from quickzones import Quick\n"
        "from opentelemetry import trace\n"
        "from opentelemetry.sdk.trace import TracerProvider\n"
        "from opentelemetry.sdk.trace.export import SimpleSpanProcessor\n"
        "from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter\n"
        "exporter = InMemorySpanExporter(); provider = TracerProvider()\n"
        "provider.add_span_processor(SimpleSpanProcessor(exporter))\n"
        "trace.set_tracer_provider(provider)\n"
        "q = Quick.open('memory://'); q.job('job')(lambda p, c: None)\n"
        "q.enqueue('job', {}, app='a', tenant='t'); q.run_until_idle()\n"
        "spans = exporter.get_finished_spans()\n"
        "run = [s for s in spans if s.name == 'quick.run'][0]\n"
        "enq = [s for s in spans if s.name == 'quick.enqueue'][0]\n"
        "linked = [link.context.span_id == enq.context.span_id for link in run.links]\n"
        "print(sorted(s.name for s in spans), linked)\n"
    )
    assert out.strip() == "['quick.enqueue', 'quick.run'] [True]"
