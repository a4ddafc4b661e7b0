"""Issue 28, point 15: every name the API accepts works on every route, a ``/`` (sent as
``%2F``) and a ``%`` included; and (point 18) path bytes that are not UTF-8 are refused
with 400, never read as U+FFFD."""

from __future__ import annotations

import socket

import pytest

from quickzones.adapters.http.client import RemoteQuick

from .conftest import Served

NAMES = ["acme/eu", "50%/off", "a%2Fb", "sp ace?#", "日本/東京"]


@pytest.mark.parametrize("tenant", NAMES)
def test_a_slash_or_percent_in_a_tenant_or_item_id_works_on_every_route(
    served: Served, tenant: str
) -> None:
    item = f"order/{tenant}"
    with RemoteQuick(served.url, served.a_all) as rq:
        rq.enqueue("job", 1, app="a", tenant=tenant, item_id=item)
        status = rq.status("a", tenant, item)
        assert status is not None and status.state == "queued"  # found under its own name
        [lease] = rq.lease(wait_s=2)
        assert (lease.tenant, lease.item_id) == (tenant, item)
        rq.extend(lease, 30)
        rq.nack(lease)
        [lease] = rq.lease(wait_s=2)
        rq.fail(lease, "gave up")
        assert [d["item_id"] for d in rq.dead_letters("a", tenant=tenant)] == [item]
        assert rq.requeue_dead_letters("a", tenant=tenant) == 1
        [lease] = rq.lease(wait_s=2)
        rq.complete(lease)
        assert served.q.get("a", tenant, item) is None
        rq.enqueue("job", 2, app="a", tenant=tenant, item_id=item)
        rq.cancel("a", tenant, item)
        assert served.q.get("a", tenant, item) is None
        assert rq.status("a", tenant, "never/seen") is None


def _raw(served: Served, request: bytes) -> bytes:
    host, port = served.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(request)
        answer = b""
        while chunk := s.recv(65536):  # the server closes (Connection: close)
            answer += chunk
        return answer


def test_a_path_that_is_not_utf8_is_refused(served: Served) -> None:
    path = b"/v1/apps/a/tenants/%FF%FE/items"
    body = b'{"job_type": "job"}'
    answer = _raw(
        served,
        b"POST " + path + b" HTTP/1.1\r\nHost: q\r\nAuthorization: Bearer "
        + served.a_all.encode() + b"\r\nContent-Type: application/json\r\nContent-Length: "
        + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body,
    )  # fmt: skip
    assert answer.startswith(b"HTTP/1.1 400"), answer[:200]
    assert b'"error":"invalid_path"' in answer, answer
    assert served.q.run_until_idle() == 0, "an item was stored for tenant U+FFFD"
