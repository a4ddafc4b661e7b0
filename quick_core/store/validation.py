"""Checks on every value a caller hands to the public API, each failing with a specific
:class:`~quickzones.errors.InvalidArgument` before anything is written."""

from __future__ import annotations

import json
import math
import re
import unicodedata
from typing import Any

from quickzones.errors import InvalidArgument, PayloadTooLarge

MAX_ID_LENGTH = 200
MIN_PRIORITY = -1_000_000
MAX_PRIORITY = 1_000_000
MAX_DELAY_S = 10 * 365 * 24 * 3600.0  # ten years: anything later is a bug, not a schedule
DEFAULT_MAX_PAYLOAD = 1024 * 1024

# \Z, not $: "$" also matches before a trailing newline, which let "job\n" through.
_JOB_TYPE = re.compile(r"[A-Za-z_][A-Za-z0-9_.:\-]*\Z")

# Unicode categories a name may not contain: control characters (C0, DEL and C1, such as
# NEL U+0085), line and paragraph separators (U+2028, U+2029), which break log lines and
# terminals like a newline does, and surrogates, which UTF-8 cannot encode.
_FORBIDDEN_CATEGORIES = {"Cc": "control characters", "Zl": "a line separator",
                         "Zp": "a paragraph separator"}  # fmt: skip


def check_utf8(kind: str, value: str) -> str:
    """Text must encode as UTF-8. A lone surrogate is what Python makes of a byte that is
    not UTF-8 on the command line or in a file name (``surrogateescape``)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as err:
        raise InvalidArgument(
            kind, value, f"is not valid UTF-8 (lone surrogate at position {err.start})"
        ) from None
    return value


def check_name(kind: str, value: object) -> str:
    """App, tenant and item ids: non-empty printable UTF-8 text without control characters
    or line separators."""
    if not isinstance(value, str):
        raise InvalidArgument(kind, value, "must be a string")
    if not value:
        raise InvalidArgument(kind, value, "must not be empty")
    if len(value) > MAX_ID_LENGTH:
        raise InvalidArgument(kind, value, f"longer than {MAX_ID_LENGTH} characters")
    if value.isascii() and value.isprintable():
        return value  # printable ASCII holds none of the forbidden categories (all Cc)
    check_utf8(kind, value)
    for c in value:
        what = _FORBIDDEN_CATEGORIES.get(unicodedata.category(c))
        if what is not None:
            raise InvalidArgument(kind, value, f"contains {what} (U+{ord(c):04X})")
    return value


def check_job_type(value: object) -> str:
    if isinstance(value, str) and len(value) <= MAX_ID_LENGTH and _JOB_TYPE.match(value):
        return value  # ASCII only, so valid UTF-8: every enqueue's case, one regex match
    if isinstance(value, str):
        check_utf8("job_type", value)  # said first, as it was before the identifier rule
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


# The deepest nesting of arrays and objects a JSON payload may have: what every reader
# of a payload can give back, the HTTP API's encoder included (pydantic-core's stops near
# 255 levels, and a lease response wraps the payload in three of its own).
MAX_JSON_DEPTH = 200
_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")


# What json.dumps(payload, separators=(",", ":"), allow_nan=False, ensure_ascii=False)
# builds on each call, built once: it keeps no state between calls.
_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False, ensure_ascii=False)


def encode_json(payload: Any) -> bytes:
    """Compact JSON as UTF-8, so non-ASCII text costs its UTF-8 size, not six bytes per
    character. Records written with ASCII escapes read the same.

    A payload must come back out of every reader, the HTTP API's included, so text UTF-8
    cannot hold (a lone surrogate) and nesting deeper than :data:`MAX_JSON_DEPTH` are
    refused with :class:`InvalidArgument`."""
    try:
        text = _ENCODER.encode(payload)
    except RecursionError:
        raise InvalidArgument(
            "payload", "...", f"is nested too deeply (at most {MAX_JSON_DEPTH} levels)"
        ) from None
    try:
        body = text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise InvalidArgument(
            "payload",
            "...",
            f"contains a lone surrogate (U+{ord(text[err.start]):04X}), which UTF-8, and so "
            "the HTTP API, cannot carry",
        ) from None
    _check_depth(text)
    return body


def _check_depth(text: str) -> None:
    """Refuse JSON ``text`` whose arrays and objects nest deeper than MAX_JSON_DEPTH."""
    if text.count("[") + text.count("{") <= MAX_JSON_DEPTH:
        return  # too few brackets to nest too deeply: the common case, at C speed
    depth = 0
    for c in _NOT_BRACKET.sub("", _JSON_STRING.sub("", text)):
        depth += 1 if c in "[{" else -1
        if depth > MAX_JSON_DEPTH:
            raise InvalidArgument(
                "payload", "...", f"is nested more than {MAX_JSON_DEPTH} levels deep"
            )


def encode_payload(payload: Any, max_bytes: int) -> tuple[bytes, str]:
    """Bytes are stored as given; anything else must be JSON-serialisable (and sendable
    back: :func:`encode_json`) and is stored as JSON (UTF-8). Returns (body,
    content_type)."""
    if isinstance(payload, bytes | bytearray | memoryview):
        body, content_type = bytes(payload), "bytes"
    else:
        try:
            body = encode_json(payload)
        except InvalidArgument:
            raise
        except TypeError as err:
            raise InvalidArgument("payload", payload, f"must be bytes or JSON: {err}") from err
        except ValueError as err:
            # NaN or infinity, or an integer over Python's 4,300-digit limit (whose repr
            # would fail the same way, so the value is not shown).
            raise InvalidArgument("payload", "...", f"must be bytes or JSON: {err}") from err
        content_type = "json"
    if len(body) > max_bytes:
        raise PayloadTooLarge(len(body), max_bytes)
    return body, content_type
