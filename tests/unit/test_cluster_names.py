"""A producer and a consumer of one store must name the same cluster (issue 40 point 6):
the store's layout records list its clusters, and an open of a cluster the store does not
have while it has others is refused with an error that names them and the way to fix it,
in Python and from the ``quick`` command line. Before, a consumer configured for another
cluster name ran 0 of 5 items and said nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from quickzones.client import Quick
from quickzones.errors import ConfigurationError
from quickzones.store.layout import LayoutMismatch, UnknownCluster
from tests.conftest import store_url


@pytest.fixture(params=["sqlite", "memory-shared"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    # memory:// is a new store per open: sqlite, and one memory store reopened over its kv.
    if request.param == "sqlite":
        return store_url("sqlite", tmp_path)
    return "kv"


def _open(url: str, first: list[Quick], **options: object) -> Quick:
    """Open ``url``; "kv": the first Quick's store again (one memory:// store)."""
    if url == "kv":
        if not first:
            first.append(Quick.open("memory://", **options))  # type: ignore[arg-type]
            return first[0]
        return Quick(first[0].kv, **options)  # type: ignore[arg-type]
    return Quick.open(url, **options)  # type: ignore[arg-type]


def test_a_consumer_of_another_cluster_is_refused_and_told_which(url: str) -> None:
    opened: list[Quick] = []
    producer = _open(url, opened)
    ids = [producer.enqueue("j", n, app="a", tenant=f"t{n}") for n in range(5)]
    with pytest.raises(UnknownCluster) as refused:
        _open(url, opened, cluster="prod")
    text = str(refused.value)
    assert "no cluster 'prod'" in text and "'default'" in text
    assert "cluster='default'" in text and "new_cluster=True" in text
    # Opened as the producer's cluster, the consumer runs all five.
    consumer = _open(url, opened, cluster="default")
    ran: list[str] = []
    consumer.job("j")(lambda payload, ctx: ran.append(ctx.item_id))
    consumer.run_until_idle()
    assert sorted(ran) == sorted(ids)


def test_a_producer_of_another_cluster_is_refused_too(url: str) -> None:
    opened: list[Quick] = []
    _open(url, opened, cluster="prod")  # a fresh store: any name just opens
    with pytest.raises(UnknownCluster, match="its clusters: 'prod'"):
        _open(url, opened)  # the default cluster, on a store of "prod" only


def test_new_cluster_starts_one_beside_the_others(url: str) -> None:
    opened: list[Quick] = []
    _open(url, opened)
    east = _open(url, opened, cluster="east", new_cluster=True)
    assert east.toplevel.cluster == "east"
    _open(url, opened, cluster="east")  # now the store has it: no flag needed
    with pytest.raises(UnknownCluster, match="its clusters: 'default', 'east'"):
        _open(url, opened, cluster="west")


def test_a_read_only_open_of_another_cluster_is_refused(tmp_path: Path) -> None:
    url = store_url("sqlite", tmp_path)
    Quick.open(url).close()
    with pytest.raises(UnknownCluster):
        Quick.open(url, create=False, cluster="prod")


def test_another_shard_count_is_refused_and_told_which(url: str) -> None:
    opened: list[Quick] = []
    _open(url, opened, shards=4)
    with pytest.raises(LayoutMismatch) as refused:
        _open(url, opened, shards=2)
    assert "4 shards" in str(refused.value) and "quick reshard --shards 2" in str(refused.value)


APP = """
import os
from quickzones import Quick

q = Quick.open(os.environ["QUICK_STORE"], cluster=os.environ["CLUSTER"])

@q.job("j")
def j(payload, ctx):
    pass
"""


def test_quick_worker_of_another_cluster_exits_with_the_error(tmp_path: Path) -> None:
    url = store_url("sqlite", tmp_path)
    producer = Quick.open(url)
    for n in range(5):
        producer.enqueue("j", n, app="a", tenant=f"t{n}")
    producer.close()
    (tmp_path / "clusterapp.py").write_text(APP)
    env = {**os.environ, "QUICK_STORE": url, "CLUSTER": "prod"}
    done = subprocess.run(
        [sys.executable, "-m", "quickzones", "worker", "--app-module", "clusterapp:q"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode != 0, done.stdout
    assert "no cluster 'prod'" in done.stderr and "'default'" in done.stderr, done.stderr
    assert "new_cluster=True" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_error_is_a_configuration_error() -> None:
    assert issubclass(UnknownCluster, ConfigurationError)
