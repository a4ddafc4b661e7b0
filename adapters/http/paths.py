"""Names in paths: every app, tenant and item id the API accepts is usable in a route, a
``/`` (sent as ``%2F``) and a ``%`` included; path bytes that are not UTF-8 are refused.

uvicorn decodes the path before routing, so ``acme%2Feu`` would route as two segments
and match no route. :class:`PathSegments` rebuilds the path of each ``/v1`` request
from its raw bytes a segment at a time, each segment decoded as UTF-8 (else 400
``invalid_path``) and with only ``%`` and ``/`` escaped again; the routes' ``{name:seg}``
parameters (:class:`SegmentConvertor`) undo those two escapes. So a name travels
unchanged, and no other way of writing it reaches a route.
"""

from __future__ import annotations

import re
from urllib.parse import unquote_to_bytes

from starlette.convertors import Convertor, register_url_convertor
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

_ESCAPED = re.compile("%(25|2F)")
_API = b"/v1/"


class SegmentConvertor(Convertor[str]):
    """One path segment, as :class:`PathSegments` left it: ``%25`` and ``%2F`` undone."""

    regex = "[^/]+"

    def convert(self, value: str) -> str:
        return _ESCAPED.sub(lambda m: "%" if m.group(1) == "25" else "/", value)

    def to_string(self, value: str) -> str:
        return value.replace("%", "%25").replace("/", "%2F")


register_url_convertor("seg", SegmentConvertor())


def segment_path(raw: bytes) -> str:
    """A raw path, each segment decoded (UTF-8, strictly) with ``%`` and ``/`` escaped
    again; UnicodeDecodeError for bytes that are not UTF-8."""
    return "/".join(
        unquote_to_bytes(part).decode("utf-8").replace("%", "%25").replace("/", "%2F")
        for part in raw.split(b"/")
    )


class PathSegments:
    """The ASGI middleware described above."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        raw = scope.get("raw_path") if scope["type"] == "http" else None
        if raw is not None:
            try:
                path = segment_path(raw)
            except UnicodeDecodeError as err:
                response = JSONResponse(
                    {
                        "error": "invalid_path",
                        "detail": f"the path is not UTF-8 (byte {err.start} of a segment)",
                    },
                    status_code=400,
                )
                await response(scope, receive, send)
                return
            if raw.startswith(_API):
                scope = {**scope, "path": path}
        await self.app(scope, receive, send)
