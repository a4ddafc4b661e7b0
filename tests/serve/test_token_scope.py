"""Issue 28, point 1: a token's app is an app name, checked as an enqueue checks it; only
``--all-apps`` makes a token for every app, and a ``*`` stored as a token's app (by a
version before that rule) is never read as every app."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx

from quickzones.client import Quick
from quickzones.store.kv import run

from .conftest import serve_process


def _quick(store: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "quickzones", *args, "--store", store],
        capture_output=True,
        text=True,
        timeout=60,
    )


def _token(store: str, *options: str) -> str:
    made = _quick(store, "tokens", "create", *options, "--json")
    assert made.returncode == 0, made.stderr
    return str(json.loads(made.stdout)["token"])


def test_an_app_named_star_is_refused_and_a_stored_star_is_no_wildcard(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'q.db'}"
    q = Quick.open(store)
    secret = q.enqueue("charge", {"amount": 10}, app="billing", tenant="acme")
    q.close()

    # The attacker's step: a produce-only token "for app *".
    star = _quick(store, "tokens", "create", "--app", "*", "--role", "produce")
    assert star.returncode == 2, star.stdout
    assert "--all-apps" in star.stderr, star.stderr
    for bad in ["", "a\nb", "x" * 201]:
        refused = _quick(store, "tokens", "create", "--app", bad, "--role", "produce")
        assert refused.returncode == 2 and "app" in refused.stderr, (bad, refused.stderr)
    listed = _quick(store, "tokens", "list", "--json")
    assert json.loads(listed.stdout) == [], "a refused token was stored"

    # A token stored before the rule, with app "*", as the old `tokens create` wrote it.
    old = _token(store, "--app", "mail", "--role", "produce", "--role", "admin")
    token_id = old.split("_")[1]
    q = Quick.open(store)
    key = q.keys.meta_key("serve-token", token_id)
    raw = run(q.kv, lambda tr: tr.get(key))
    assert raw is not None
    record = {**json.loads(raw), "app": "*"}
    run(q.kv, lambda tr: tr.set(key, json.dumps(record).encode()))
    q.close()
    operator = _token(store, "--all-apps", "--role", "produce", "--role", "admin")

    with serve_process(store) as (url, _):
        h = {"Authorization": f"Bearer {old}"}
        item = f"{url}/v1/apps/billing/tenants/acme/items/{secret}"
        assert httpx.get(item, headers=h).status_code == 403
        assert httpx.delete(item, headers=h).status_code == 403
        r = httpx.post(f"{url}/v1/apps/billing/tenants/acme/items", json={"job_type": "j"},
                       headers=h)  # fmt: skip
        assert r.status_code == 403 and r.json()["error"] == "forbidden_app"
        assert httpx.get(f"{url}/v1/shards", headers=h).status_code == 403
        assert httpx.get(f"{url}/v1/apps/billing/stats", headers=h).status_code == 403
        # The operator's token made with --all-apps still acts on every app.
        op = {"Authorization": f"Bearer {operator}"}
        assert httpx.get(item, headers=op).json()["state"] == "queued"
        assert httpx.get(f"{url}/v1/shards", headers=op).status_code == 200
    q = Quick.open(store)
    try:
        assert q.get("billing", "acme", secret) is not None, "the other app's item was cancelled"
    finally:
        q.close()
