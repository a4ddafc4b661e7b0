"""Checks on every value a caller hands to the public API, each failing with a specific
:class:`~quick_core.errors.InvalidArgument` before anything is written."""

from __future__ import annotations

import json
import math
import re
from typing import Any

from quick_core.errors import InvalidArgument, PayloadTooLarge

MAX_ID_LENGTH = 200
MIN_PRIORITY = -1_000_000
MAX_PRIORITY = 1_000_000
MAX_DELAY_S = 10 * 365 * 24 * 3600.0  # ten years: anything later is a bug, not a schedule
DEFAULT_MAX_PAYLOAD = 1024 * 1024

_JOB_TYPE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.:\-]*$")


def check_name(kind: str, value: object) -> str:
    """App, tenant and item ids: non-empty printable text without control characters."""
    if not isinstance(value, str):
        raise InvalidArgument(kind, value, "must be a string")
    if not value:
        raise InvalidArgument(kind, value, "must not be empty")
    if len(value) > MAX_ID_LENGTH:
        raise InvalidArgument(kind, value, f"longer than {MAX_ID_LENGTH} characters")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        raise InvalidArgument(kind, value, "contains control characters")
    return value


def check_job_type(value: object) -> str:
    if not isinstance(value, str) or not _JOB_TYPE.match(value) or len(value) > MAX_ID_LENGTH:
        raise InvalidArgument(
            "job_type", value, "must be an identifier such as 'send_email' or 'mail.send'"
        )
    return value


def check_priority(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument("priority", value, "must be an integer")
    if not MIN_PRIORITY <= value <= MAX_PRIORITY:
        raise InvalidArgument(
            "priority", value, f"must be between {MIN_PRIORITY} and {MAX_PRIORITY}"
        )
    return value


def check_seconds(kind: str, value: object, *, maximum: float = MAX_DELAY_S) -> float:
    """Delays, TTLs and durations in seconds: finite, not negative, not absurd."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidArgument(kind, value, "must be a number of seconds")
    if math.isnan(value) or math.isinf(value):
        raise InvalidArgument(kind, value, "must be finite")
    if value < 0:
        raise InvalidArgument(kind, value, "must not be negative")
    if value > maximum:
        raise InvalidArgument(kind, value, f"must be at most {maximum:g} seconds")
    return float(value)


def encode_payload(payload: Any, max_bytes: int) -> tuple[bytes, str]:
    """Bytes are stored as given; anything else must be JSON-serialisable and is stored as
    JSON. Returns (body, content_type)."""
    if isinstance(payload, bytes | bytearray | memoryview):
        body, content_type = bytes(payload), "bytes"
    else:
        try:
            body = json.dumps(payload, separators=(",", ":"), allow_nan=False).encode()
        except (TypeError, ValueError) as err:
            raise InvalidArgument("payload", payload, f"must be bytes or JSON: {err}") from err
        content_type = "json"
    if len(body) > max_bytes:
        raise PayloadTooLarge(len(body), max_bytes)
    return body, content_type
