"""Property tests generated from the server's own OpenAPI document (schemathesis): no
request, however odd, gets a 5xx. Over real HTTP, on a memory store with a few items,
leases and dead letters in it so the routes have something to find."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

schemathesis = pytest.importorskip("schemathesis")

from hypothesis import HealthCheck, given, settings  # noqa: E402

from quickzones.adapters.http import TokenStore, create_app  # noqa: E402
from quickzones.client import Quick  # noqa: E402

from .conftest import ServerThread  # noqa: E402

_TOKEN: dict[str, str] = {}


@pytest.fixture(scope="module")
def api_schema() -> Iterator[Any]:
    q = Quick.open("memory://")
    tokens = TokenStore(q.kv, q.keys, q.clock)
    _TOKEN["op"] = tokens.create_for_all_apps(["produce", "consume", "admin"])[0]
    for n in range(5):
        q.enqueue("job", {"n": n}, app="a", tenant=f"t{n}", item_id=f"i{n}")
    q.enqueue("job", b"bytes", app="a", tenant="t0", item_id="dead")
    with ServerThread(create_app(q, max_body=256 * 1024)) as server:
        yield schemathesis.openapi.from_url(server.url + "/openapi.json")
    q.close()


def test_no_server_errors(api_schema: Any) -> None:
    failures: list[str] = []
    statuses: dict[int, int] = {}
    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert len(operations) >= 15
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(
            max_examples=25,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            derandomize=True,
            database=None,
        )
        def call(case: Any) -> None:
            if case.path == "/v1/leases" and isinstance(case.body, dict):
                # A long poll is correct behaviour, but would make the run slow.
                case.body["wait_s"] = 0
            response = case.call(headers={"Authorization": f"Bearer {_TOKEN['op']}"})
            statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
            if response.status_code >= 500:
                failures.append(
                    f"{case.method} {case.formatted_path} {case.body!r}: "
                    f"{response.status_code} {response.text[:300]}"
                )

        call()
    assert not failures, "\n".join(failures[:20])
    # The generated requests reached the routes, not only the validation layer.
    assert sum(statuses.values()) > 200 and statuses.get(200, 0) > 20, statuses
