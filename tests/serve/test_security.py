"""Token rules: 401 without or with a bad token, 403 for another app or a missing role,
tokens stored hashed, revocation, and the CLI that manages them."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from quickzones.adapters.http import TokenStore
from quickzones.adapters.http.app import TOKEN_CACHE_S
from quickzones.client import Quick
from quickzones.clock import ManualClock
from quickzones.errors import InvalidArgument
from quickzones.testing.provision.ports import free_port

from .conftest import Served

ENQUEUE = "/v1/apps/{app}/tenants/t/items"


def _post(served: Served, path: str, token: str | None, body: object) -> httpx.Response:
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    return httpx.post(served.url + path, json=body, headers=headers)


def test_no_token_is_401_and_nothing_is_stored(served: Served) -> None:
    r = _post(served, ENQUEUE.format(app="a"), None, {"job_type": "j"})
    assert r.status_code == 401 and r.json()["error"] == "unauthenticated"
    assert r.headers["www-authenticate"] == "Bearer"
    for bad in ["nope", "qz_abc_def", served.a_all + "x", served.a_all[:-1]]:
        r = _post(served, ENQUEUE.format(app="a"), bad, {"job_type": "j"})
        assert r.status_code == 401 and r.json()["error"] == "invalid_token", bad
    assert served.q.run_until_idle() == 0


def test_token_for_another_app_is_403(served: Served) -> None:
    r = _post(served, ENQUEUE.format(app="b"), served.a_all, {"job_type": "j"})
    assert r.status_code == 403 and r.json()["error"] == "forbidden_app"
    r = _post(served, "/v1/leases", served.a_all, {"app": "b"})
    assert r.status_code == 403
    r = _post(served, "/v1/leases", served.a_all, {"app": "*"})
    assert r.status_code == 403
    h = {"Authorization": f"Bearer {served.a_all}"}
    for path in ["/v1/apps/b/stats", "/v1/apps/b/dead-letters", "/v1/apps/b/zones", "/v1/shards"]:
        assert httpx.get(served.url + path, headers=h).status_code == 403, path
    r = _post(served, ENQUEUE.format(app="a"), served.b_all, {"job_type": "j"})
    assert r.status_code == 403
    assert served.q.run_until_idle() == 0


def test_missing_role_is_403(served: Served) -> None:
    assert (
        _post(served, ENQUEUE.format(app="a"), served.a_produce, {"job_type": "j"}).status_code
        == 201
    )
    r = _post(served, "/v1/leases", served.a_produce, {})
    assert r.status_code == 403 and r.json()["error"] == "forbidden_role"
    h = {"Authorization": f"Bearer {served.a_produce}"}
    assert httpx.get(served.url + "/v1/apps/a/stats", headers=h).status_code == 403
    r = _post(served, "/v1/apps/a/dead-letters/purge", served.a_produce, {})
    assert r.status_code == 403


def _refused_within(served: Served, token: str, seconds: float) -> float:
    """Seconds until a request with ``token`` is 401: a request sent ``seconds`` after
    the start must be refused (when it was sent counts, not when a loaded machine
    answered it: one sent at 1.45 s and answered at 1.53 s was admitted rightly)."""
    start = time.monotonic()
    while True:
        sent = time.monotonic() - start
        status = _post(served, ENQUEUE.format(app="a"), token, {"job_type": "j"}).status_code
        if status == 401:
            return sent
        assert status == 201 and sent < seconds, (status, sent)
        time.sleep(0.05)


def test_revoked_token_is_401_within_the_cache_ttl(served: Served) -> None:
    # The server checks a token against the store at most once per TOKEN_CACHE_S (a
    # revocation by another process, as this TokenStore is, takes effect within that).
    token, info = served.tokens.create("a", ["produce"])
    assert _post(served, ENQUEUE.format(app="a"), token, {"job_type": "j"}).status_code == 201
    served.tokens.revoke(info.token_id)
    _refused_within(served, token, TOKEN_CACHE_S + 0.5)


def test_a_token_is_read_from_the_store_once_per_ttl() -> None:
    # A user's complaint: every request of a busy pull consumer re-reads its token.
    clock = ManualClock()
    q = Quick.open("memory://", clock=clock)
    try:
        tokens = TokenStore(q.kv, q.keys, q.clock, cache_s=1.0)
        token, info = tokens.create("a", ["consume"])
        other, _ = tokens.create("a", ["consume"])
        assert tokens.check(token) == info
        assert tokens.cached(token) == info
        # Revoked behind its back (another process): still admitted until the TTL ends.
        TokenStore(q.kv, q.keys, q.clock).revoke(info.token_id)
        clock.advance(0.9)
        assert tokens.check(token) == info
        clock.advance(0.2)
        assert tokens.cached(token) is None and tokens.check(token) is None
        # A wrong secret with a cached token's id is never admitted from the cache.
        assert tokens.check(other) is not None
        assert tokens.check(other[:-1] + ("A" if other[-1] != "A" else "B")) is None
        # Revoked through the same store: refused at once.
        assert tokens.check(other) is not None
        tokens.revoke(other.split("_")[1])
        assert tokens.check(other) is None
    finally:
        q.close()


def test_tokens_are_not_cached_unless_asked() -> None:
    q = Quick.open("memory://")
    try:
        tokens = TokenStore(q.kv, q.keys, q.clock)
        token, info = tokens.create("a", ["consume"])
        assert tokens.check(token) == info
        TokenStore(q.kv, q.keys, q.clock).revoke(info.token_id)
        assert tokens.check(token) is None
    finally:
        q.close()


def test_tokens_are_stored_hashed(tmp_path: Path) -> None:
    path = tmp_path / "t.db"
    q = Quick.open(f"sqlite:///{path}")
    try:
        store = TokenStore(q.kv, q.keys, q.clock)
        token, info = store.create("a", ["admin"], label="ops")
        # The secret may itself contain "_" (urlsafe base64): split after the id only.
        secret = token.removeprefix(f"qz_{info.token_id}_")
        assert len(secret) >= 40, token
        assert store.check(token) == info
        with pytest.raises(InvalidArgument):
            store.create("a", ["root"])
        with pytest.raises(InvalidArgument):
            store.create("a", [])
    finally:
        q.close()
    raw = path.read_bytes() + b"".join(p.read_bytes() for p in tmp_path.glob("t.db-*"))
    assert secret.encode() not in raw and token.encode() not in raw


def _quick(*args: str, env_store: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "quickzones", "--store", env_store, *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_cli_tokens_and_serve_in_a_real_process(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'q.db'}"
    Quick.open(store).close()
    made = _quick("tokens", "create", "--app", "a", "--role", "produce", "--role", "admin",
                  "--label", "ci", "--json", env_store=store)  # fmt: skip
    assert made.returncode == 0, made.stderr
    created = json.loads(made.stdout)
    assert created["roles"] == ["produce", "admin"] and created["token"].startswith("qz_")
    both = _quick("tokens", "create", "--app", "a", "--all-apps", "--role", "admin",
                  env_store=store)  # fmt: skip
    assert both.returncode == 2 and "exactly one" in both.stderr
    listed = _quick("tokens", "list", "--json", env_store=store)
    assert [t["token_id"] for t in json.loads(listed.stdout)] == [created["token_id"]]
    assert created["token"] not in listed.stdout

    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "quickzones",
            "serve",
            "--store",
            store,
            "--port",
            str(port),
            "--log-level",
            "warning",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ},
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(url + "/v1/health").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline, "quick serve did not start"
            time.sleep(0.1)
        h = {"Authorization": f"Bearer {created['token']}"}
        r = httpx.post(url + "/v1/apps/a/tenants/t/items", json={"job_type": "j"}, headers=h)
        assert r.status_code == 201
        revoked = _quick("tokens", "revoke", created["token_id"], env_store=store)
        assert revoked.returncode == 0, revoked.stderr
        deadline = time.monotonic() + TOKEN_CACHE_S + 0.5  # the server's token cache
        while True:
            r = httpx.post(url + "/v1/apps/a/tenants/t/items", json={"job_type": "j"}, headers=h)
            if r.status_code == 401 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert r.status_code == 401
        # Bound to loopback only: the port is not open on another local address.
        listening = subprocess.run(["ss", "-ltnH", f"sport = :{port}"], capture_output=True,
                                   text=True).stdout  # fmt: skip
        if listening.strip():
            assert re.search(rf"127\.0\.0\.1:{port}\b", listening), listening
            assert f"0.0.0.0:{port}" not in listening and f"*:{port}" not in listening
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=20)
    again = _quick("tokens", "revoke", created["token_id"], env_store=store)
    assert again.returncode == 2 and "no token" in again.stderr
