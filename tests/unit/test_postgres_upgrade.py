"""A rolling upgrade on PostgreSQL (issue 42 point 4): a store of the previous release's
layout is migrated online while processes enqueue into it, nothing acknowledged is lost,
and a process of the previous release stops with one clear line instead of a traceback
per try (seen: 358 UndefinedColumn tracebacks in 12 s from old workers after a new
process migrated)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import pytest

from quickzones.client import Quick
from quickzones.testing.provision.postgres import postgres_skip_reason
from tests.postgres import SESSION, postgres_store_url, shared_postgres_url

pytestmark = pytest.mark.skipif(
    postgres_skip_reason() is not None, reason=str(postgres_skip_reason())
)
psycopg = pytest.importorskip("psycopg")

# A process of this release: opens the store (the first to do so migrates it) and
# enqueues, printing each acknowledged item's id.
NEW_PROCESS = textwrap.dedent(
    """
    import sys
    from quickzones.client import Quick
    q = Quick.open(sys.argv[1])
    for n in range(int(sys.argv[3])):
        print(q.enqueue("job", {"n": n}, app="a", tenant=sys.argv[2] + str(n % 5)), flush=True)
    q.close()
    """
)
# A process of the previous release: commits as it did (layout 2's resolver) until the
# store refuses, then says why in one line and stops.
OLD_PROCESS = textwrap.dedent(
    """
    import sys, psycopg
    from tests.pg_layout2_sql import commit_as_layout_2
    with psycopg.connect(sys.argv[1], autocommit=True) as conn:
        n = 0
        while True:
            try:
                commit_as_layout_2(conn, sys.argv[2], b"old-%06d" % n, b"v")
            except psycopg.Error as err:
                print("STOPPED:", str(err).splitlines()[0], flush=True)
                break
            print(n, flush=True)
            n += 1
    """
)


@pytest.fixture()
def admin() -> Iterator[object]:
    with psycopg.connect(shared_postgres_url(), autocommit=True) as conn:
        yield conn


def test_a_layout_2_store_migrates_online_while_processes_enqueue(admin: object) -> None:
    from tests.pg_layout2_sql import make_layout_2

    schema = f"{SESSION}_upgrade_{os.urandom(3).hex()}"
    url = postgres_store_url(schema)
    first = Quick.open(url)
    before = first.enqueue("job", {"n": -1}, app="a", tenant="before")
    first.close()
    make_layout_2(admin, schema)
    server = url.split("?")[0]
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    old = subprocess.Popen(
        [sys.executable, "-c", OLD_PROCESS, server, schema],
        stdout=subprocess.PIPE,
        text=True,
        cwd=root,  # tests.pg_layout2_sql: the previous release's statements
    )
    assert old.stdout is not None
    assert old.stdout.readline().strip() == "0"  # the old process commits before
    new = [
        subprocess.Popen(
            [sys.executable, "-c", NEW_PROCESS, url, f"p{i}-", "40"],
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(3)
    ]
    acknowledged = [before]
    for process in new:
        out, _ = process.communicate(timeout=120)
        assert process.returncode == 0
        acknowledged.extend(out.split())
    lines = ["0", *(line.strip() for line in old.stdout)]  # to its end: it stopped
    assert old.wait(60) == 0
    assert lines[-1].startswith("STOPPED:") and "upgrade it" in lines[-1], lines[-1]
    old_committed = [int(n) for n in lines[:-1]]
    q = Quick.open(url)
    try:
        ran: list[str] = []
        q.job("job")(lambda payload, ctx: ran.append(ctx.item_id))
        assert q.run_until_idle() == len(acknowledged) == 121
        assert sorted(ran) == sorted(acknowledged)
    finally:
        q.close()
    s = f'"{schema}"'
    keys = admin.execute(  # type: ignore[attr-defined]
        f"SELECT key FROM {s}.kv WHERE key >= 'old-' AND key < 'old.'"
    ).fetchall()
    assert sorted(bytes(k) for (k,) in keys) == [b"old-%06d" % n for n in old_committed]
