"""History charts as inline SVG, drawn on the server: no script, no CDN, and nothing the
page's Content-Security-Policy (``default-src 'self'``) refuses (presentation attributes,
never style attributes). Every text drawn is escaped."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Protocol

from markupsafe import Markup, escape

from quickzones.adapters.http.fairness import MinutePoint
from quickzones.store.pickups import BOUNDS_MS, OVER, percentile_label
from quickzones.store.run_figures import ErrorMinute

_W, _H, _LEFT, _BOTTOM, _TOP = 640, 160, 48, 20, 10


def _clock(minute: int) -> str:
    return datetime.fromtimestamp(minute * 60, tz=UTC).strftime("%H:%M")


class _Minute(Protocol):
    @property
    def minute(self) -> int: ...


def _frame(title: str, points: Sequence[_Minute], top_label: str, body: list[str]) -> Markup:
    first, last = (_clock(points[0].minute), _clock(points[-1].minute)) if points else ("", "")
    parts = [
        f'<svg class="chart" role="img" viewBox="0 0 {_W} {_H}" width="{_W}" height="{_H}"'
        f' aria-label="{escape(title)}" xmlns="http://www.w3.org/2000/svg">',
        f"<title>{escape(title)}</title>",
        f'<line x1="{_LEFT}" y1="{_H - _BOTTOM}" x2="{_W}" y2="{_H - _BOTTOM}" stroke="#999"/>',
        f'<line x1="{_LEFT}" y1="{_TOP}" x2="{_LEFT}" y2="{_H - _BOTTOM}" stroke="#999"/>',
        f'<text x="{_LEFT - 4}" y="{_TOP + 8}" text-anchor="end" font-size="10">'
        f"{escape(top_label)}</text>",
        f'<text x="{_LEFT - 4}" y="{_H - _BOTTOM}" text-anchor="end" font-size="10">0</text>',
        f'<text x="{_LEFT}" y="{_H - 4}" font-size="10">{first} UTC</text>',
        f'<text x="{_W}" y="{_H - 4}" text-anchor="end" font-size="10">{last}</text>',
        *body,
        "</svg>",
    ]
    return Markup("".join(parts))


def throughput_chart(points: list[MinutePoint]) -> Markup:
    """Items started per minute, one bar a minute."""
    peak = max((p.started for p in points), default=0) or 1
    step = (_W - _LEFT) / max(1, len(points))
    height = _H - _BOTTOM - _TOP
    bars = []
    for i, p in enumerate(points):
        if p.started == 0:
            continue
        h = height * p.started / peak
        x, y = _LEFT + i * step, _H - _BOTTOM - h
        bars.append(
            f'<rect data-minute="{p.minute}" data-started="{p.started}" x="{x:.1f}" y="{y:.1f}"'
            f' width="{max(1.0, step - 1):.1f}" height="{h:.1f}" fill="#3a6ea5">'
            f"<title>{_clock(p.minute)}: {p.started} started</title></rect>"
        )
    return _frame("Items started per minute", points, f"{peak}/min", bars)


def _log_y(ms: int) -> float:
    """Height on a log scale from 1 ms to the last bucket's bound."""
    top = math.log10(OVER)
    return (_H - _BOTTOM - _TOP) * math.log10(max(1, ms)) / top


def latency_chart(points: list[MinutePoint]) -> Markup:
    """Pickup latency p50 and p99 per minute (log scale; a point is its bucket's bound)."""
    step = (_W - _LEFT) / max(1, len(points))
    body: list[str] = []
    for ms, label in ((100, "100 ms"), (1_000, "1 s"), (10_000, "10 s")):
        y = f"{_H - _BOTTOM - _log_y(ms):.1f}"
        body.append(
            f'<line x1="{_LEFT}" y1="{y}" x2="{_W}" y2="{y}" stroke="#eee"/>'
            f'<text x="{_LEFT - 4}" y="{y}" text-anchor="end" font-size="10">{label}</text>'
        )
    series: tuple[tuple[str, str, Callable[[MinutePoint], int | None]], ...] = (
        ("p50", "#3a6ea5", lambda p: p.p50_ms),
        ("p99", "#c0392b", lambda p: p.p99_ms),
    )
    for name, colour, pick in series:
        coords = [
            (f"{_LEFT + (i + 0.5) * step:.1f}", f"{_H - _BOTTOM - _log_y(v):.1f}", p.minute, v)
            for i, p in enumerate(points)
            if (v := pick(p)) is not None
        ]
        if coords:  # a line, and a dot a minute (one minute alone draws no line)
            line = " ".join(f"{x},{y}" for x, y, _, _ in coords)
            body.append(
                f'<polyline data-series="{name}" points="{line}" fill="none"'
                f' stroke="{colour}" stroke-width="2"/>'
            )
            body.extend(
                f'<circle data-series="{name}" cx="{x}" cy="{y}" r="2.5" fill="{colour}">'
                f"<title>{_clock(minute)} {name}: {escape(percentile_label(v))}</title></circle>"
                for x, y, minute, v in coords
            )
    body.append(
        f'<text x="{_W - 4}" y="{_TOP + 8}" text-anchor="end" font-size="10" fill="#3a6ea5">'
        'p50</text><text x="{0}" y="{1}" text-anchor="end" font-size="10" fill="#c0392b">'
        "p99</text>".format(_W - 4, _TOP + 20)
    )
    return _frame("Pickup latency per minute", points, f"{BOUNDS_MS[-1] // 1000} s", body)


# Colours of the job types in the errors chart, in the order of the legend (then again).
PALETTE = ("#c0392b", "#3a6ea5", "#d68910", "#7d3c98", "#16a085", "#566573")


def errors_chart(minutes: list[ErrorMinute], job_types: list[str]) -> Markup:
    """Failed runs per minute, one bar a minute stacked by job type (``job_types``, in
    the legend's order: a type's colour is its place there)."""
    peak = max((m.total for m in minutes), default=0) or 1
    step = (_W - _LEFT) / max(1, len(minutes))
    height = _H - _BOTTOM - _TOP
    colour = {t: PALETTE[n % len(PALETTE)] for n, t in enumerate(job_types)}
    bars = []
    for i, m in enumerate(minutes):
        y = float(_H - _BOTTOM)
        for job_type in job_types:
            n = m.by_type.get(job_type, 0)
            if n == 0:
                continue
            h = height * n / peak
            y -= h
            bars.append(
                f'<rect data-minute="{m.minute}" data-type="{escape(job_type)}"'
                f' data-errors="{n}" x="{_LEFT + i * step:.1f}" y="{y:.1f}"'
                f' width="{max(1.0, step - 1):.1f}" height="{h:.1f}" fill="{colour[job_type]}">'
                f"<title>{_clock(m.minute)} {escape(job_type)}: {n} failed</title></rect>"
            )
    return _frame("Failed runs per minute", minutes, f"{peak}/min", bars)
