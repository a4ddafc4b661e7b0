"""Issue 41, point 5: batches at the documented maximum (``POST .../batches`` of 10,000
items) commit when eight come at once, a batch that cannot be written says to send it
again (``Retry-After``) or in smaller batches, and a batch is stored whole or not at all."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import httpx

from quickzones.adapters.http import create_app
from quickzones.adapters.http.tokens import TokenStore
from quickzones.adapters.http.views import zone_items
from quickzones.backends.memory import MemoryStore
from quickzones.backends.memory.faults import FaultConfig
from quickzones.client import Quick

from .conftest import ServerThread, serve_process

CONCURRENT = 8
MAX_BATCH_ITEMS = 10_000  # the documented maximum (docs/serve.md, the OpenAPI document)


def _batch(n: int) -> dict[str, object]:
    return {"job_type": "j", "items": [{"payload": {"n": k, "pad": "x" * 40}} for k in range(n)]}


def _stored(q: Quick, tenant: str) -> int:
    total, _ = zone_items(q, q.zone("a", tenant), offset=0, limit=1)
    return total


def test_8_concurrent_batches_of_the_maximum_all_commit_over_sqlite(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'q.db'}"
    Quick.open(store).close()
    made = subprocess.run(
        [sys.executable, "-m", "quickzones", "tokens", "create", "--app", "a", "--role",
         "produce", "--json", "--store", store],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    auth = {"Authorization": f"Bearer {json.loads(made.stdout)['token']}"}
    body = json.dumps(_batch(MAX_BATCH_ITEMS)).encode()
    answers: dict[int, httpx.Response | Exception] = {}
    with serve_process(store) as (url, _proc):

        def post(n: int) -> None:
            try:
                answers[n] = httpx.post(
                    f"{url}/v1/apps/a/tenants/t{n}/batches",
                    content=body,
                    headers={**auth, "Content-Type": "application/json"},
                    timeout=120,
                )
            except Exception as err:  # reported below, with the others' answers
                answers[n] = err

        threads = [threading.Thread(target=post, args=(n,)) for n in range(CONCURRENT)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        # Before: 8 of 8 answered 503 transaction_too_old after about 20 s.
        seen = {n: getattr(a, "status_code", repr(a)) for n, a in sorted(answers.items())}
        assert all(code == 201 for code in seen.values()), seen
    q = Quick.open(store, create=False)
    try:
        for n in range(CONCURRENT):
            answer = answers[n]
            assert isinstance(answer, httpx.Response)
            assert len(set(answer.json()["item_ids"])) == MAX_BATCH_ITEMS
            assert _stored(q, f"t{n}") == MAX_BATCH_ITEMS
    finally:
        q.close()


def test_one_item_over_the_maximum_is_refused_naming_it(tmp_path: Path) -> None:
    q = Quick.open(f"sqlite:///{tmp_path / 'q.db'}")
    tokens = TokenStore(q.kv, q.keys, q.clock)
    token = tokens.create("a", ["produce"])[0]
    try:
        with ServerThread(create_app(q, tokens=tokens, max_body=8 * 1024 * 1024)) as server:
            r = httpx.post(
                f"{server.url}/v1/apps/a/tenants/t/batches",
                json=_batch(MAX_BATCH_ITEMS + 1),
                headers={"Authorization": f"Bearer {token}"},
                timeout=60,
            )
        assert r.status_code == 422, r.text
        assert "10000" in r.json()["detail"], r.text
        assert _stored(q, "t") == 0
    finally:
        q.close()


def test_a_batch_whose_commit_fails_stores_nothing_and_says_to_send_it_again() -> None:
    store = MemoryStore(seed=1, retry_limit=3)  # refused commits: 3 retries, not 60 s
    q = Quick(store)
    tokens = TokenStore(q.kv, q.keys, q.clock)
    token = tokens.create("a", ["produce"])[0]
    auth = {"Authorization": f"Bearer {token}"}
    with ServerThread(create_app(q, tokens=tokens)) as server:
        tokens.check(token)  # read once before the faults: the check is a transaction too
        # Every commit with writes is refused: the batch's transaction fails after its
        # items were written into it, at its commit.
        store.faults = FaultConfig(not_committed=1.0)
        r = httpx.post(
            f"{server.url}/v1/apps/a/tenants/t/batches",
            json=_batch(1000),
            headers=auth,
            timeout=120,
        )
        assert r.status_code == 503, r.text
        assert r.headers.get("Retry-After", "").isdigit(), r.headers
        assert r.json()["error"] == "batch_not_written", r.text
        assert "smaller batches" in r.json()["detail"], r.text
        store.faults = FaultConfig()
        assert _stored(q, "t") == 0  # none of its 1,000 items
        r = httpx.post(f"{server.url}/v1/apps/a/tenants/t/batches", json=_batch(1000), headers=auth)
        assert r.status_code == 201, r.text
        assert _stored(q, "t") == 1000
