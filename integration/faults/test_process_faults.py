"""Process-level faults on the real stores this machine runs: consumer processes killed
with SIGKILL and paused with SIGSTOP at random points under load, the election server
(Redis or memcached) killed and restarted, all over one SQLite file. At the end every
at-least-once item ran at least once and every at-most-once item at most once."""

from __future__ import annotations

import os
import random
import textwrap
import time
from collections import Counter
from pathlib import Path

import pytest

from integration.faults.fleet import ConsumerFleet
from integration.services import SERVICES, ServiceUnavailable
from quickzones.client import Quick

CONSUMER = textwrap.dedent(
    """
    import os, sys
    from quickzones.client import Quick
    from quickzones.consumer import ConsumerConfig
    from quickzones.urls import open_election

    url, log_path, election_url = sys.argv[1], sys.argv[2], sys.argv[3]
    q = Quick.open(url)
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)

    def record(payload, ctx):
        os.write(fd, (ctx.item_id + "\\n").encode())

    q.job("alo")(record)
    q.job("amo", delivery="at_most_once")(record)
    config = ConsumerConfig(
        item_lease_s=1.0, pointer_lease_s=0.5, idle_sleep_s=0.01, election_ttl_s=2.0,
        min_inactive_s=1.0, workers=4, managers=2,
    )
    q.consumer(config, election=open_election(election_url)).run_forever()
    """
)


def _server(kind: str):  # type: ignore[no-untyped-def]
    try:
        return SERVICES[kind]().start()
    except ServiceUnavailable as err:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{err} (CI=true: refusing to skip)", pytrace=False)
        pytest.skip(str(err))


@pytest.mark.parametrize("election", ["redis", "memcached"])
def test_consumers_killed_and_paused_under_load(tmp_path: Path, election: str) -> None:
    rng = random.Random(7)
    server = _server(election)
    url = f"sqlite:///{tmp_path / 'faults.db'}"
    producer = Quick.open(url)
    alo: set[str] = set()
    amo: set[str] = set()
    faults: Counter[str] = Counter()
    fleet = ConsumerFleet(tmp_path, CONSUMER, url, 3, [server.url])
    try:
        end = time.time() + 12
        while time.time() < end:
            for _ in range(rng.randint(5, 15)):
                tenant = f"t{rng.randint(0, 19)}"
                alo.add(producer.enqueue("alo", b"", app="app", tenant=tenant))
                if rng.random() < 0.2:
                    amo.add(producer.enqueue("amo", b"", app="app", tenant=tenant))
            fault = rng.random()
            slot = rng.randrange(3)
            if fault < 0.08:
                fleet.kill(slot)
                faults["sigkill"] += 1
            elif fault < 0.14:
                fleet.pause(slot, rng.uniform(0.5, 2.0))  # past its leases
                faults["sigstop"] += 1
            elif fault < 0.16:
                server.restart()  # the election store loses everything
                faults["election_restart"] += 1
            time.sleep(0.1)
        # Quiesce: no more faults; everything must drain.
        deadline = time.time() + 60
        while time.time() < deadline:
            if alo <= set(fleet.ran()) and producer.zones.count(producer.zone("app", "t0")) == 0:
                break
            time.sleep(0.5)
    finally:
        fleet.stop()
        server.close()
    ran = fleet.ran()
    lost = alo - set(ran)
    twice = [i for i in amo if ran[i] > 1]
    print(
        f"faults injected: {dict(faults)}; items {len(alo)} + {len(amo)} at-most-once; "
        f"lost {len(lost)}; at-most-once run twice {len(twice)}"
    )
    assert not lost, f"{len(lost)} at-least-once items never ran"
    assert not twice
    assert faults["sigkill"] + faults["sigstop"] >= 3
