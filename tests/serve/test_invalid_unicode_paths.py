"""Issue 41, point 14: a path whose percent-escapes are not UTF-8 (``/v1/apps/%ff%fe/...``),
on any route of a real ``quick serve``, API or dashboard, answers 400 in the API's error
shape, and the server logs no traceback for it (at most a line a request)."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from quickzones.client import Quick

from .conftest import serve_process

PATHS = [
    "/v1/apps/%ff%fe/tenants/t/items",
    "/v1/apps/%ff%fe/stats",
    "/v1/apps/a/tenants/%ED%A0%80/items/x",  # an encoded surrogate: not UTF-8 either
    "/v1/apps/a/tenants/t/items/%C0%AF/complete",  # an overlong "/"
    "/v1/apps/a/batches/%ff",
    "/apps/%ff%fe",
    "/apps/a/tenants/%fe",
    "/static/%ff",
]


def _ask(port: int, method: str, path: str) -> tuple[int, dict[str, object]]:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(
            f"{method} {path} HTTP/1.1\r\nHost: q\r\nAuthorization: Bearer qz_x_y\r\n"
            "Content-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n"
            "\r\n{}".encode()
        )
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


@pytest.mark.parametrize("method", ["GET", "POST"])
def test_a_path_that_is_not_utf8_is_400_in_the_api_shape_and_logs_no_traceback(
    tmp_path: Path, method: str
) -> None:
    store = f"sqlite:///{tmp_path / 'q.db'}"
    Quick.open(store).close()
    with serve_process(store) as (url, proc):
        port = int(url.rsplit(":", 1)[1])
        for path in PATHS:
            status, body = _ask(port, method, path)
            assert status == 400, (path, status, body)
            assert body["error"] == "invalid_path" and "UTF-8" in str(body["detail"]), body
    assert proc.stderr is not None
    logged = proc.stderr.read()
    assert "Traceback" not in logged, logged
    assert logged.count("\n") <= 2 + len(PATHS), logged  # its banner, and a line a request
