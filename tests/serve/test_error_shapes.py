"""Issue 28, point 18: bad JSON bodies and unknown routes answer with the API's error
shape (a stable ``error`` code and a ``detail``), and ``RemoteQuick`` raises the library's
own errors, never a raw httpx one."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from quickzones.adapters.http.client import (
    AsyncRemoteQuick,
    RemoteError,
    RemoteQuick,
    RemoteUnavailable,
)
from quickzones.errors import QuickError
from quickzones.testing.provision.ports import free_port

from .conftest import Served

CASES = [
    ("POST", "/v1/leases", b"{not json", 422, "invalid_request"),
    ("POST", "/v1/apps/a/tenants/t/items",
     b'{"job_type":"j","payload":' + b"[" * 5000 + b"]" * 5000 + b"}", 400, "invalid_body"),
    ("POST", "/v1/leases", b'{"app": "\xff"}', 400, "invalid_body"),
    ("GET", "/v1/nope", None, 404, "not_found"),
    ("PUT", "/v1/leases", None, 405, "method_not_allowed"),
]  # fmt: skip


@pytest.mark.parametrize(("method", "path", "body", "status", "code"), CASES)
def test_bad_bodies_and_unknown_routes_answer_with_an_error_code(
    served: Served, method: str, path: str, body: bytes | None, status: int, code: str
) -> None:
    h = {"Authorization": f"Bearer {served.a_all}", "Content-Type": "application/json"}
    r = httpx.request(method, served.url + path, content=body, headers=h)
    assert r.status_code == status, r.text[:200]
    assert r.json()["error"] == code and r.json()["detail"], r.text[:200]


def test_remote_quick_raises_its_own_errors_never_httpx() -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nobody listens
    with RemoteQuick(url, "qz_x_y", timeout_s=2) as rq, pytest.raises(RemoteUnavailable) as err:
        rq.enqueue("job", 1, app="a", tenant="t")
    assert isinstance(err.value, QuickError) and isinstance(err.value.__cause__, httpx.HTTPError)

    async def remote() -> None:
        async with AsyncRemoteQuick(url, "qz_x_y", timeout_s=2) as aq:
            await aq.lease(wait_s=0)

    with pytest.raises(RemoteUnavailable):
        asyncio.run(remote())


def test_remote_quick_wraps_an_answer_that_is_not_json() -> None:
    # What a proxy in front of the server may answer.
    html = httpx.MockTransport(lambda _: httpx.Response(200, text="<html>gateway</html>"))
    with RemoteQuick("http://quick", "qz_x_y", transport=html) as rq, pytest.raises(
        RemoteError
    ) as err:
        rq.stats("a")
    assert err.value.error == "bad_response" and "gateway" in err.value.detail
