"""Remote workers obey named limits as local ones do (issue 45 point 2, the rest of it):
a run leased through ``quick serve``'s POST /v1/leases holds its slots of each limit its
job type names (``cost`` of each) from the lease until its outcome arrives. Before, the
remote workers took none: with a limit of 2, the 8 remote workers ran 8 at once beside
the local worker's 2."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from quickzones.adapters.http import TokenStore
from quickzones.adapters.http.client import RemoteQuick
from quickzones.client import Quick
from tests.waiting import wait_for

from .conftest import Served, serve_process

HANDLER_S = 0.15

HANDLERS = """
import os, time
from quickzones import Quick

# The local worker's Quick is the store; a remote worker's only holds its handlers.
quick = Quick.open(os.environ.get("STORE", "memory://"))
SPANS = os.environ["SPANS"]
WHERE = "local" if "STORE" in os.environ else "remote"

def run(payload, ctx):
    start = time.time()
    time.sleep(HANDLER_S)
    with open(SPANS, "a") as f:
        f.write(f"{WHERE} {ctx.item.job_type} {start} {time.time()}\\n")

quick.job("send", limits=["emails"])(run)
quick.job("bounce", limits=["emails"])(run)
quick.job("digest", limits=["emails"], cost=2)(run)  # both slots of the limit
""".replace("HANDLER_S", str(HANDLER_S))

COST = {"send": 1, "bounce": 1, "digest": 2}


def _spans(path: Path) -> list[tuple[str, float, float]]:
    lines = path.read_text().splitlines() if path.exists() else []
    return [(t, float(s), float(e)) for _, t, s, e in (line.split() for line in lines)]


def _where(path: Path) -> list[str]:
    if not path.exists():
        return []
    return [line.split()[0] for line in path.read_text().splitlines()]


def _start(cmd: list[str], cwd: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )


def most_slots_at_once(spans: list[tuple[str, float, float]]) -> int:
    """The most slots (a run's cost) held by runs open at one moment."""
    edges = sorted([(s, COST[t]) for t, s, _ in spans] + [(e, -COST[t]) for t, _, e in spans])
    most = now = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return most


def test_remote_and_local_workers_share_a_named_limit(tmp_path: Path) -> None:
    """A limit of 2 shared by three job types (one of cost 2), 2 ``quick worker --remote``
    processes of 4 workers each against ``quick serve`` plus one local ``quick worker``:
    never more than 2 slots' worth running, and every item runs."""
    url = f"sqlite:///{tmp_path / 'q.db'}"
    q = Quick.open(url)
    try:
        q.set_limit("a", "emails", concurrency=2)
        token = TokenStore(q.kv, q.keys, q.clock).create("a", ["consume"])[0]
        for name, n in (("send", 16), ("bounce", 16), ("digest", 8)):
            for t in range(4):
                q.enqueue_many(name, list(range(n // 4)), app="a", tenant=f"t{t}")
        (tmp_path / "limited_handlers.py").write_text(HANDLERS)
        spans = tmp_path / "spans.txt"
        env = {**os.environ, "QUICK_TOKEN": token, "SPANS": str(spans), "PYTHONUNBUFFERED": "1"}
        env.pop("QUICK_STORE", None)
        worker = [sys.executable, "-m", "quickzones", "worker", "--app-module", "limited_handlers"]
        with serve_process(url) as (server, _):
            remote = [*worker, "--remote", server, "--workers", "4"]
            procs = [_start(remote, tmp_path, env) for _ in range(2)]
            # The local worker joins once the remote ones run, so both share the limit.
            assert wait_for(lambda: len(_spans(spans)) >= 4, 120), _where(spans)
            local = [*worker, "--workers", "4", "--shutdown-deadline", "5"]
            procs.append(_start(local, tmp_path, {**env, "STORE": url}))
            try:
                assert wait_for(lambda: len(_spans(spans)) >= 40, 180), len(_spans(spans))
            finally:
                for proc in procs:
                    proc.terminate()
                errors = [proc.communicate(timeout=60)[1] for proc in procs]
        ran = _spans(spans)
        assert not any(b"Traceback" in e for e in errors), errors
        assert len(ran) == 40
        assert most_slots_at_once(ran) <= 2, most_slots_at_once(ran)
        # Both kinds of worker ran some of them: the limit is shared, not left to one.
        assert set(_where(spans)) == {"local", "remote"}
    finally:
        q.close()


EMAILS = {"send": {"limits": ["emails"], "cost": 1}, "digest": {"limits": ["emails"], "cost": 2}}


def test_a_full_limit_leaves_the_item_unleased_and_counts_no_attempt(served: Served) -> None:
    """Through POST /v1/leases: a run holds its slots from the lease until its outcome
    arrives; an item leased while the limit is full is given back unstarted."""
    served.q.set_limit("a", "emails", concurrency=2)
    ids = [served.q.enqueue("send", n, app="a", tenant="t") for n in range(3)]
    with RemoteQuick(served.url, served.a_all) as client:
        first = client.lease(5, lease_s=30.0, wait_s=1.0, named_limits=EMAILS)
        first += client.lease(5, lease_s=30.0, wait_s=0.3, named_limits=EMAILS)
        assert len(first) == 2, f"{len(first)} leased under a limit of 2"
        assert client.lease(5, lease_s=30.0, wait_s=0.5, named_limits=EMAILS) == []
        (waiting,) = set(ids) - {x.item_id for x in first}
        item = served.q.get("a", "t", waiting)
        assert item is not None and item.attempts == 0 and item.lease_id is None
        client.complete(first[0])  # its outcome frees its slot
        (third,) = client.lease(5, lease_s=30.0, wait_s=5.0, named_limits=EMAILS)
        assert third.item_id == waiting
        for x in (first[1], third):
            client.complete(x)
    assert served.q.list_limits("a")[0].concurrency == 2


def test_a_run_of_cost_2_takes_both_slots(served: Served) -> None:
    served.q.set_limit("a", "emails", concurrency=2)
    served.q.enqueue("send", 0, app="a", tenant="t")
    served.q.enqueue("digest", 1, app="a", tenant="t", delay=0.5)  # vests second
    with RemoteQuick(served.url, served.a_all) as client:
        (send,) = client.lease(5, lease_s=30.0, wait_s=1.0, named_limits=EMAILS)
        # One slot is free, the digest needs two: not leased until the send ends.
        assert client.lease(5, lease_s=30.0, wait_s=1.0, named_limits=EMAILS) == []
        client.complete(send)
        (digest,) = client.lease(5, lease_s=30.0, wait_s=5.0, named_limits=EMAILS)
        assert digest.job_type == "digest"
        served.q.enqueue("send", 2, app="a", tenant="t")
        assert client.lease(5, lease_s=30.0, wait_s=0.5, named_limits=EMAILS) == []
        client.complete(digest)
        assert len(client.lease(5, lease_s=30.0, wait_s=5.0, named_limits=EMAILS)) == 1


def test_a_cancelled_run_gives_its_slots_back(served: Served) -> None:
    served.q.set_limit("a", "emails", concurrency=1)
    for n in range(2):
        served.q.enqueue("send", n, app="a", tenant="t")
    with RemoteQuick(served.url, served.a_all) as client:
        (running,) = client.lease(5, lease_s=60.0, wait_s=1.0, named_limits=EMAILS)
        served.q.cancel("a", "t", running.item_id)
        # Its remote worker hears it went (as it asks every half second): the slot frees.
        assert client.cancelled([running]) == [True]
        assert len(client.lease(5, lease_s=60.0, wait_s=5.0, named_limits=EMAILS)) == 1


def test_a_limit_the_app_does_not_define_holds_its_items(served: Served) -> None:
    served.q.enqueue("send", 0, app="a", tenant="t")
    with RemoteQuick(served.url, served.a_all) as client:
        assert client.lease(5, lease_s=30.0, wait_s=0.5, named_limits=EMAILS) == []
        served.q.set_limit("a", "emails", concurrency=1)
        assert len(client.lease(5, lease_s=30.0, wait_s=8.0, named_limits=EMAILS)) == 1


@pytest.mark.parametrize(
    ("refs", "status", "says"),
    [
        ({"send": {"limits": ["emails", "emails"]}}, 400, "name each limit once"),
        ({"send": {"limits": []}}, 422, "limits"),
        ({"send": {"limits": ["emails"], "cost": 0}}, 422, "cost"),
        ({"send": {"limits": [""]}}, 400, "invalid limit name"),
        ({"send": {"limits": ["emails"], "extra": 1}}, 422, "extra"),
    ],
)
def test_bad_named_limits_in_a_lease_request_are_refused(
    served: Served, refs: dict[str, Any], status: int, says: str
) -> None:
    served.q.set_limit("a", "emails", concurrency=1)
    item_id = served.q.enqueue("send", 0, app="a", tenant="t")
    answer = httpx.post(
        served.url + "/v1/leases",
        json={"max_items": 1, "named_limits": refs},
        headers={"Authorization": f"Bearer {served.a_all}"},
        timeout=30,
    )
    assert answer.status_code == status, answer.text
    assert says in answer.text
    item = served.q.get("a", "t", item_id)
    assert item is not None and item.lease_id is None  # nothing leased, nothing lost
