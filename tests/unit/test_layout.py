"""The top-level queue's layout (how many shards decide where a pointer lives) is stored
with the queue: a process opened with another layout is refused, one that says nothing
uses the stored one (issue 27, point 1.4)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from quickzones.client import Quick
from quickzones.clock import ManualClock
from quickzones.errors import ConfigurationError
from tests.conftest import store_url
from tests.waiting import wait_for


def test_a_consumer_opened_with_other_shards_is_refused_not_starved(
    backend: str, tmp_path: Path, clock: ManualClock
) -> None:
    producer = Quick.open(store_url(backend, tmp_path), clock=clock, shards=4)
    ids = [
        producer.enqueue("job", {"n": i}, app="app", tenant=f"t{i}") for i in range(20)
    ]

    with pytest.raises(ConfigurationError) as refused:
        Quick(producer.kv, clock=clock, shards=1)
    assert "4 shards" in str(refused.value) and "1 shard" in str(refused.value)

    consumer = Quick(producer.kv, clock=clock)  # says nothing: the stored layout
    assert consumer.toplevel.shards == 4
    ran: list[str] = []
    consumer.job("job")(lambda payload, ctx: ran.append(ctx.item_id))
    consumer.run_until_idle()
    assert sorted(ran) == sorted(ids)
    producer.close()


def test_first_open_stores_the_layout_others_follow(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'q.db'}"
    first = Quick.open(url, shards=3)
    first.close()
    again = Quick.open(url)
    assert again.toplevel.shards == 3
    same = Quick.open(url, shards=3)  # the same layout, said again: fine
    assert same.toplevel.shards == 3
    again.close()
    same.close()


def test_a_read_only_open_writes_no_layout(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'q.db'}"
    Quick.open(url, shards=1).close()  # a quick store, layout stored
    q = Quick.open(url, create=False)
    assert q.toplevel.shards == 1
    q.close()


APP = """
import os
from quickzones.client import Quick

shards = os.environ.get("SHARDS")
q = Quick.open(os.environ["QUICK_STORE"], **({"shards": int(shards)} if shards else {}))

@q.job("job")
def job(payload, ctx):
    with open(os.environ["RUN_LOG"], "a") as log:
        log.write(ctx.item_id + "\\n")
"""

PRODUCER = """
import os, sys
from quickzones.client import Quick

q = Quick.open(os.environ["QUICK_STORE"], shards=4)
for i in range(20):
    print(q.enqueue("job", {"n": i}, app="app", tenant=f"t{i}"))
q.close()
"""


def test_cli_worker_with_other_shards_is_refused(tmp_path: Path) -> None:
    (tmp_path / "layoutapp.py").write_text(APP)
    log = tmp_path / "runs.log"
    log.touch()
    env = {**os.environ, "QUICK_STORE": f"sqlite:///{tmp_path / 'q.db'}", "RUN_LOG": str(log)}
    made = subprocess.run(
        [sys.executable, "-c", PRODUCER], env=env, capture_output=True, text=True, check=True
    )
    ids = made.stdout.split()
    quick = [sys.executable, "-m", "quickzones"]
    cli = subprocess.run(
        [*quick, "enqueue", "--app", "app", "--tenant", "cli", "--job-type", "job"],
        env=env, capture_output=True, text=True, check=True,
    )
    ids.append(cli.stdout.strip())
    worker = [*quick, "worker", "--app-module", "layoutapp:q", "--managers", "1"]

    refused = subprocess.Popen(
        worker, cwd=tmp_path, env={**env, "SHARDS": "1"}, stderr=subprocess.PIPE, text=True
    )
    try:
        _, err = refused.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        refused.kill()
        refused.wait()
        ran = len(set(log.read_text().split()))
        pytest.fail(f"a worker opened with shards=1 ran {ran} of {len(ids)} items and kept going")
    assert refused.returncode == 2
    assert "4 shards" in err and "1 shard" in err and "Traceback" not in err

    follows = subprocess.Popen(worker, cwd=tmp_path, env=env)
    try:
        assert wait_for(lambda: len(set(log.read_text().split())) >= len(ids))
    finally:
        follows.terminate()
        follows.wait(timeout=60)
    assert sorted(log.read_text().split()) == sorted(ids)


def test_a_store_used_without_a_stored_layout_refuses_a_layout_it_contradicts(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'q.db'}"
    old = Quick.open(url)  # asks for nothing: 1 shard, nothing stored
    for i in range(8):
        old.enqueue("job", b"", app="app", tenant=f"t{i}")
    with pytest.raises(ConfigurationError, match="no stored layout"):
        Quick.open(url, shards=4)  # would strand the pointers in shard 0
    assert Quick.open(url, shards=1).toplevel.shards == 1  # stored now
    with pytest.raises(ConfigurationError, match="1 shard"):
        Quick.open(url, shards=4)
    old.close()
