"""OpenTelemetry tracing, when ``opentelemetry-api`` is installed: a span per enqueue and a
span per item run, linked across the queue through a W3C trace context stored in the
item's metadata. Without the package every function here is a cheap no-op.

OpenTelemetry is not imported here until something else has imported its API (an
application configuring a provider must: ``opentelemetry.trace.set_tracer_provider``;
so does ``opentelemetry-instrument``) or a provider is given to
:func:`use_tracer_provider`: importing it, with its propagators' entry points, cost every
process that traces nothing 4 % of quick's import instructions and 20-30 ms of its wall
time (callgrind and 15 alternating imports; a ``cProfile`` run had overstated it)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

from quickzones.store.records import WorkItem, ZoneId

TRACE_KEY = "_trace"
_API = "opentelemetry.trace"


_provider: Any = None


def _api() -> tuple[Any, Any]:
    """OpenTelemetry's propagate and trace modules, once a tracer exists (so the optional
    package is installed and imported)."""
    try:
        from opentelemetry import propagate, trace
    except ImportError as err:  # tracing is optional: a tracer implies the package
        raise RuntimeError("a tracer without opentelemetry-api installed") from err
    return propagate, trace


def use_tracer_provider(provider: Any) -> None:
    """Trace with this provider instead of the global one (None: back to global)."""
    global _provider
    _provider = provider


_tracers: dict[int, Any] = {}


def _tracer() -> Any:
    """The tracer, or None when no SDK provider is configured: the API alone would hand out
    no-op spans, and making them costs tens of microseconds per item on the hot path."""
    trace: Any = sys.modules.get(_API)
    if trace is None:
        if _provider is None:
            return None  # nothing imported the API: no provider can be configured
        try:
            from opentelemetry import trace
        except ImportError:  # tracing is optional
            return None
    provider = _provider if _provider is not None else trace.get_tracer_provider()
    if isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
        return None
    tracer = _tracers.get(id(provider))
    if tracer is None:
        tracer = _tracers[id(provider)] = provider.get_tracer("quick")
    return tracer


def enqueue_span(job_type: str, zone: ZoneId) -> AbstractContextManager[dict[str, str]]:
    """Yields the carrier to store in the item's metadata (empty without tracing)."""
    tracer = _tracer()
    if tracer is None:
        # Not a generator: every enqueue enters this, and a generator's context manager
        # costs a microsecond or two that nothing traced pays for.
        return nullcontext({})
    return _enqueue_span(tracer, job_type, zone)


@contextmanager
def _enqueue_span(tracer: Any, job_type: str, zone: ZoneId) -> Iterator[dict[str, str]]:
    propagate, trace = _api()

    with tracer.start_as_current_span(
        "quick.enqueue",
        kind=trace.SpanKind.PRODUCER,
        attributes={"quick.job_type": job_type, "quick.app": zone.app},
    ):
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        yield carrier


_NO_SPAN = nullcontext()


def run_span(item: WorkItem, zone: ZoneId) -> AbstractContextManager[None]:
    """A consumer span for one run, linked to the span that enqueued the item. Without a
    tracer, one shared no-op context: no generator is made per run (issue 44 point 5)."""
    tracer = _tracer()
    if tracer is None:
        return _NO_SPAN
    return _run_span(tracer, item, zone)


@contextmanager
def _run_span(tracer: Any, item: WorkItem, zone: ZoneId) -> Iterator[None]:
    propagate, trace = _api()

    links = []
    carrier = item.meta.get(TRACE_KEY)
    if isinstance(carrier, dict):
        parent = trace.get_current_span(propagate.extract(carrier)).get_span_context()
        if parent.is_valid:
            links.append(trace.Link(parent))
    with tracer.start_as_current_span(
        "quick.run",
        kind=trace.SpanKind.CONSUMER,
        links=links,
        attributes={
            "quick.job_type": item.job_type,
            "quick.app": zone.app,
            "quick.item_id": item.item_id,
            "quick.attempt": item.error_count + 1,
        },
    ):
        yield
