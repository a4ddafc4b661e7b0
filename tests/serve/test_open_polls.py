"""Issue 28, point 3: long polls (``POST /v1/leases`` with ``wait_s``) hold no server
thread while they wait, and open polls are limited per token and in all: one over a
limit is answered at once with 429, the API's error code and Retry-After."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import httpx

from quickzones.adapters.http import TokenStore, create_app
from quickzones.client import Quick

from .conftest import ServerThread, serve_process

# How long the open polls wait. Each test lasts about this long whatever it checks: the polls
# that get no work in the first return only then, and quick serve's shutdown waits for the
# cancelled ones in the second. 10 s leaves 8 s after _open_polls' 2 s for the few requests
# made while the polls must still be open (20 s before: both tests took 24 s).
POLL_WAIT_S = 10


def _token(store: str, *options: str) -> str:
    made = subprocess.run(
        [sys.executable, "-m", "quickzones", "tokens", "create", *options, "--json",
         "--store", store],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return str(json.loads(made.stdout)["token"])


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def _open_polls(
    url: str, token: str, n: int, wait_s: float
) -> tuple[httpx.AsyncClient, list[asyncio.Task[httpx.Response]]]:
    client = httpx.AsyncClient(
        base_url=url,
        headers=_bearer(token),
        timeout=wait_s + 60,
        limits=httpx.Limits(max_connections=n + 10, max_keepalive_connections=n + 10),
    )
    polls = [
        asyncio.create_task(client.post("/v1/leases", json={"wait_s": wait_s})) for _ in range(n)
    ]
    await asyncio.sleep(2)  # the requests reach the server and start waiting
    return client, polls


def test_230_open_polls_leave_another_apps_enqueue_and_health_answering(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'q.db'}"
    Quick.open(store).close()
    consumer = _token(store, "--app", "photos", "--role", "consume", "--role", "produce")
    billing = _token(store, "--app", "billing", "--role", "produce")

    async def scenario(url: str) -> None:
        client, polls = await _open_polls(url, consumer, 230, wait_s=POLL_WAIT_S)
        try:
            async with httpx.AsyncClient(base_url=url, timeout=60) as other:
                health = await other.get("/v1/health")
                open_at_health = sum(not p.done() for p in polls)
                enq = await other.post(
                    "/v1/apps/billing/tenants/acme/items",
                    json={"job_type": "charge"},
                    headers=_bearer(billing),
                )
                open_at_enqueue = sum(not p.done() for p in polls)
            assert health.status_code == 200 and enq.status_code == 201, enq.text
            assert (open_at_health, open_at_enqueue) == (230, 230), (
                "health and another app's enqueue answered only once polls had returned: "
                f"{open_at_health} and {open_at_enqueue} of 230 still open"
            )
            # Work for the waiting polls: they wake and lease it, each item once.
            work = {"job_type": "resize", "items": [{"payload": n} for n in range(50)]}
            await client.post("/v1/apps/photos/tenants/t/batches", json=work)
            answers = await asyncio.gather(*polls)
        finally:
            await client.aclose()
        assert {r.status_code for r in answers} == {200}
        payloads = [x["payload"] for r in answers for x in r.json()["items"]]
        assert len(payloads) == len(set(payloads)) and len(payloads) > 0

    with serve_process(store) as (url, _):
        asyncio.run(scenario(url))


def test_polls_past_the_servers_descriptor_budget_are_answered_at_once_with_429(
    tmp_path: Path,
) -> None:
    """The limits come from the process's open-file limit (``quick serve`` reads it; here
    passed to the app factory): at 256 descriptors the server holds 64 connections, a
    quarter of them (16) in long polls, a quarter of those (4) of one token."""
    q = Quick.open(f"sqlite:///{tmp_path / 'q.db'}")
    tokens = TokenStore(q.kv, q.keys, q.clock)
    a, b, c, d, e = (tokens.create(app, ["consume"])[0] for app in "abcde")

    async def scenario(url: str) -> None:
        opened = [await _open_polls(url, token, 4, wait_s=POLL_WAIT_S) for token in (a, b, c, d)]
        client_a, client_e = opened[0][0], httpx.AsyncClient(base_url=url, headers=_bearer(e))
        polls = [p for _, ps in opened for p in ps]
        try:
            over_a = await client_a.post("/v1/leases", json={"wait_s": POLL_WAIT_S})  # a's fifth
            over_all = await client_e.post("/v1/leases", json={"wait_s": POLL_WAIT_S})  # the 17th
            now_a = await client_a.post("/v1/leases", json={"wait_s": 0})  # no long poll
            assert not any(p.done() for p in polls)
        finally:
            for p in polls:
                p.cancel()
            for client, _ in opened:
                await client.aclose()
            await client_e.aclose()
        for over, which in ((over_a, "this token"), (over_all, "the server")):
            assert over.status_code == 429, over.text
            assert over.json()["error"] == "too_many_polls", over.text
            assert which in over.json()["detail"], over.text
            assert int(over.headers["retry-after"]) >= 1
        assert now_a.status_code == 200 and now_a.json() == {"items": []}

    try:
        with ServerThread(create_app(q, open_files=256)) as server:
            asyncio.run(scenario(server.url))
    finally:
        q.close()


def test_the_poll_limits_are_no_quick_serve_options(tmp_path: Path) -> None:
    for option in ("--long-polls", "--long-polls-per-token", "--max-connections",
                   "--header-timeout"):  # fmt: skip
        done = subprocess.run(
            [sys.executable, "-m", "quickzones", "serve", "--store",
             f"sqlite:///{tmp_path / 'q.db'}", option, "5"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 2, (option, done.stderr)
        assert "No such option" in done.stderr, done.stderr
