"""The ``quick`` CLI and tenant moves over ``fdb://`` on the real cluster (issue 14, point 2):
``quick demo``, ``quick enqueue``, ``quick worker`` (a real process), ``quick stats``,
``quick dead-letters``, and ``move-tenant`` between two key prefixes of one cluster."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest

from integration.fdb.cluster import session_cluster_file
from quickzones.backends.fdb import FDBStore
from quickzones.client import Quick
from quickzones.store.kv import KVTransaction, run
from quickzones.store.tenant_move import KVMoveSource, move_tenant

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.fdb


def _url(cluster: str, root: str) -> str:
    return f"fdb://{quote(cluster)}?root={quote(root)}"


def _clear(url: str) -> None:
    store = FDBStore.from_url(url)

    def clear(tr: KVTransaction) -> None:
        tr.clear_range(b"", b"\xff")  # under the URL's root: only this test's keys

    run(store, clear)
    store.close()


@pytest.fixture
def url() -> Iterator[str]:
    u = _url(session_cluster_file(), f"quick-e2e-{uuid.uuid4().hex}/")
    yield u
    _clear(u)


def quick_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    # The console script's module, in a child process: the real CLI, with the env the
    # session fixture set (FDB_LIBRARY_PATH, LD_LIBRARY_PATH).
    return subprocess.run(
        [sys.executable, "-m", "quickzones", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
    )


def test_cli_demo_on_fdb(url: str) -> None:
    out = quick_cli("demo", "--store", url, "--tenants", "4", "--duration", "2", "--rate", "5",
                    "--workers", "2", "--work-ms", "0")  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    stats = quick_cli("stats", "--store", url, "--json")
    assert stats.returncode == 0, stats.stderr[-3000:]
    assert json.loads(stats.stdout)["vested"] == 0  # the demo drained what it enqueued


HANDLERS = textwrap.dedent(
    """
    import os
    from quickzones.client import Quick
    from quickzones.registry import RetryPolicy

    quick = Quick.open(os.environ["QUICK_STORE"])

    @quick.job("ok")
    def ok(payload, ctx):
        pass

    @quick.job("fails", retry=RetryPolicy(max_attempts=1, jitter=False))
    def fails(payload, ctx):
        raise RuntimeError("always")
    """
)


def test_cli_enqueue_worker_stats_dead_letters_on_fdb(url: str, tmp_path: Path) -> None:
    for i in range(6):
        out = quick_cli("enqueue", "--store", url, "--app", "shop", "--tenant", f"t{i % 3}",
                        "--job-type", "ok", "--payload", json.dumps({"i": i}))  # fmt: skip
        assert out.returncode == 0, out.stderr[-3000:]
    out = quick_cli("enqueue", "--store", url, "--app", "shop", "--tenant", "t0",
                    "--job-type", "fails", "--id", "doomed")  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    stats = json.loads(quick_cli("stats", "--store", url, "--json").stdout)
    assert stats["vested"] == 7 and stats["active_zones"] == 3

    (tmp_path / "handlers.py").write_text(HANDLERS)
    env = {**os.environ, "QUICK_STORE": url, "PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}"}
    worker = subprocess.Popen(
        [sys.executable, "-m", "quickzones", "worker", "--app-module", "handlers:quick",
         "--workers", "2", "--managers", "1"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            stats = json.loads(quick_cli("stats", "--store", url, "--json").stdout)
            if stats["vested"] == 0 and stats["leased"] == 0 and stats["dead_letters"] == 1:
                break
            time.sleep(0.5)
        assert stats["dead_letters"] == 1 and stats["vested"] == 0, stats
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(30) == 0
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait(10)
    listed = quick_cli("dead-letters", "list", "--store", url)
    assert listed.returncode == 0 and "doomed" in listed.stdout, listed.stderr[-3000:]
    purged = quick_cli("dead-letters", "purge", "--store", url, "--app", "shop", "--tenant", "t0")
    assert purged.returncode == 0, purged.stderr[-3000:] + purged.stdout
    stats = json.loads(quick_cli("stats", "--store", url, "--json").stdout)
    assert stats["dead_letters"] == 0


def test_move_tenant_between_two_prefixes_of_one_cluster() -> None:
    cluster = session_cluster_file()
    src_url = _url(cluster, f"quick-move-src-{uuid.uuid4().hex}/")
    dst_url = _url(cluster, f"quick-move-dst-{uuid.uuid4().hex}/")
    try:
        src, dst = Quick.open(src_url), Quick.open(dst_url)
        ids = {src.enqueue("job", {"n": i}, app="a", tenant="t", priority=i % 3) for i in range(9)}
        ids.add(src.enqueue("job", {"fifo": 1}, app="a", tenant="t", fifo=True))
        move_tenant(src, dst, "a", "t")
        zone = dst.zone("a", "t")
        assert {i.item_id for i in KVMoveSource(dst).list_items(zone)} == ids
        assert src.zones.count(src.zone("a", "t")) == 0
        assert dst.toplevel.get_pointer(zone) is not None
        assert src.toplevel.get_pointer(src.zone("a", "t")) is None
        ran: list[str] = []
        dst.job("job")(lambda payload, ctx: ran.append(ctx.item_id))
        assert dst.run_until_idle() == 10 and set(ran) == ids
        src.close()
        dst.close()
        # And through the CLI, back again.
        back = Quick.open(dst_url)
        more = {back.enqueue("job", {"n": i}, app="a", tenant="u") for i in range(3)}
        back.close()
        out = quick_cli("move-tenant", "--from", dst_url, "--to", src_url, "--app", "a",
                        "--tenant", "u")  # fmt: skip
        assert out.returncode == 0 and "moved 3" in out.stdout, out.stderr[-3000:] + out.stdout
        again = Quick.open(src_url)
        assert {i.item_id for i in KVMoveSource(again).list_items(again.zone("a", "u"))} == more
        again.close()
    finally:
        _clear(src_url)
        _clear(dst_url)
