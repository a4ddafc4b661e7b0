"""How a handler failure is shown: a bounded traceback (for the log and the dead letter),
a WARNING per failure rate-limited per job type, and where an import failed.

Bounded because a dead letter is one stored value and a log line should fit a screen;
rate-limited because a poison job type failing thousands of times a minute must not drown
every other line of the log (the suppressed failures are counted, never silently lost).
"""

from __future__ import annotations

import importlib
import logging
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path

MAX_LINES = 60
MAX_BYTES = 8 * 1024

_PACKAGE_DIR = str(Path(__file__).resolve().parent)
_IMPORTLIB_DIR = str(Path(importlib.__file__).resolve().parent)


def format_failure(
    exc: BaseException, *, max_lines: int = MAX_LINES, max_bytes: int = MAX_BYTES
) -> str:
    """The exception with its traceback (and chained causes), at most ``max_lines`` lines
    and ``max_bytes`` UTF-8 bytes. The middle is cut, not the ends: the first frames say
    where the call came from, the last lines what failed."""
    lines = "".join(traceback.format_exception(exc)).rstrip("\n").splitlines()
    if len(lines) > max_lines:
        head = max(1, max_lines // 3)
        tail = max(1, max_lines - head - 1)
        omitted = len(lines) - head - tail
        lines = [*lines[:head], f"  ... {omitted} lines omitted ...", *lines[-tail:]]
    text = "\n".join(lines)
    raw = text.encode("utf-8")
    if len(raw) > max_bytes:
        # Half the budget to the first lines (where it was called from), the rest to the
        # end (what failed); a cut multi-byte character is dropped, never mangled.
        marker = b"\n  ... (traceback truncated) ...\n"
        budget = max(0, max_bytes - len(marker))
        first = raw[: budget // 2]
        if b"\n" in first:
            first = first[: first.rindex(b"\n")]
        last = raw[len(raw) - (budget - len(first)) :]
        text = (first + marker + last).decode("utf-8", "ignore")
    return text


def failure_location(exc: BaseException) -> str | None:
    """``file, line N`` of the innermost frame of ``exc`` outside quickzones and the
    import machinery: where user code failed. For a SyntaxError, where the bad line is."""
    if isinstance(exc, SyntaxError) and exc.filename:
        return f"{exc.filename}, line {exc.lineno}"
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        name = frame.filename
        if name.startswith(("<frozen", _PACKAGE_DIR, _IMPORTLIB_DIR)):
            continue
        return f"{name}, line {frame.lineno}"
    return None


class LocatedError(Exception):
    """An exception's one-line text with where it happened, for messages such as a
    handler module that failed to import."""

    def __init__(self, cause: BaseException) -> None:
        where = failure_location(cause)
        message = cause.msg if isinstance(cause, SyntaxError) else str(cause)
        text = f"{type(cause).__name__}: {message}"
        if where is not None:
            text += f" (at {where})"
        super().__init__(text)
        self.cause = cause
        self.where = where


class FailureLog:
    """Logs each handler failure once, at WARNING, with its bounded traceback: at most
    ``burst`` per job type per ``window_s`` seconds. Beyond that the failures are counted
    and the count is reported with the next one logged for that type."""

    def __init__(
        self,
        logger: logging.Logger,
        *,
        burst: int = 5,
        window_s: float = 60.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger = logger
        self.burst = burst
        self.window_s = window_s
        self._monotonic = monotonic
        self._lock = threading.Lock()
        # job type -> (window start, logged in this window, suppressed since last logged)
        self._windows: dict[str, tuple[float, int, int]] = {}

    def _admit(self, job_type: str) -> tuple[bool, int]:
        """Whether to log this failure, and how many were suppressed before it."""
        now = self._monotonic()
        with self._lock:
            start, logged, suppressed = self._windows.get(job_type, (now, 0, 0))
            if now - start >= self.window_s:
                start, logged = now, 0
            if logged < self.burst:
                self._windows[job_type] = (start, logged + 1, 0)
                return True, suppressed
            self._windows[job_type] = (start, logged, suppressed + 1)
            return False, 0

    def failed(self, job_type: str, item_id: str, where: str, attempt: int, text: str) -> bool:
        """Log one failure (``text`` from :func:`format_failure`); False if rate-limited."""
        admitted, suppressed = self._admit(job_type)
        if not admitted:
            return False
        more = f" ({suppressed} earlier failures of this type not shown)" if suppressed else ""
        self.logger.warning(
            "handler for %s failed on item %s in %s (attempt %d)%s\n%s",
            job_type,
            item_id,
            where,
            attempt,
            more,
            text,
            extra={
                "quick_event": "handler_failed",
                "quick_fields": {"job_type": job_type, "item_id": item_id, "zone": where},
            },
        )
        return True
