"""Names from a store URL and from callers reach PostgreSQL only as quoted identifiers or
as parameters (issue 41 point 2): a schema named ``a'b`` could never be reopened, and SQL
written into ``?schema=`` ran when the store was reopened. Each hostile schema is opened,
written, run, closed and reopened; the statements an injection would run bump a sequence
the test owns, which must stay untouched. Names PostgreSQL cannot hold are refused at open."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import pytest

from quickzones.client import Quick
from quickzones.errors import InvalidStoreURL
from quickzones.registry import JobContext
from quickzones.testing.provision.postgres import postgres_skip_reason, shared_postgres_url
from tests.postgres import SESSION

pytestmark = pytest.mark.skipif(
    postgres_skip_reason() is not None, reason=str(postgres_skip_reason())
)
psycopg = pytest.importorskip("psycopg")
from psycopg import sql  # noqa: E402

# Every injection below calls nextval() on this sequence if it runs. A fixed name: the
# test ids carry it, and pytest-xdist's workers must collect the same ids.
TRAP = "quick_names_test_pwned"
HOSTILE_SCHEMAS = [
    "a'b",
    'x"; select pg_sleep(5);--',
    f"x\"; select nextval('public.{TRAP}');--",
    # Inside the text literal the layout check once built: valid SQL that calls nextval.
    f"x')||nextval('public.{TRAP}')||('",
    # Inside the dollar-quoted bodies of the store's functions.
    f"a$$b; select nextval('public.{TRAP}'); $$",
    "Ünïcødé 名前 schema",
    "With Spaces And UPPER",
    "é" * 31 + "x",  # 63 bytes: PostgreSQL's longest identifier
    "x" * 63,
]
HOSTILE_NAMES = [
    "a'b",
    'x"; select pg_sleep(5);--',
    f"x'); select nextval('public.{TRAP}');--",
    "$$ Ünïcødé 名前 \\ %s %(x)s {}",
]


@pytest.fixture
def admin() -> Iterator[Any]:
    with psycopg.connect(shared_postgres_url(), autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SEQUENCE IF NOT EXISTS {}").format(sql.Identifier(TRAP)))
        yield conn


def _url(schema: str) -> str:
    return f"{shared_postgres_url()}?schema={quote(schema, safe='')}"


def _trap_untouched(admin: Any) -> bool:
    row = admin.execute(sql.SQL("SELECT is_called FROM {}").format(sql.Identifier(TRAP))).fetchone()
    return row is not None and row[0] is False


def _drop(admin: Any, schema: str) -> None:
    admin.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


@pytest.mark.parametrize("schema", HOSTILE_SCHEMAS)
def test_a_hostile_schema_is_opened_run_and_reopened_and_no_sql_of_its_runs(
    admin: Any, schema: str
) -> None:
    _drop(admin, schema)
    try:
        ran: list[tuple[str, str, str]] = []
        for payload in ("first", "second"):
            q = Quick.open(_url(schema))  # the second open finds the schema quick made
            try:

                @q.job("t")
                def t(payload: object, ctx: JobContext) -> None:
                    ran.append((ctx.zone.app, ctx.zone.tenant, str(payload)))

                # The item enqueued before the close is there after the reopen.
                assert q.run_until_idle() == (0 if payload == "first" else 1)
                q.enqueue("t", payload, app="a", tenant="b")
            finally:
                q.close()
        assert ran == [("a", "b", "first")]
        # The tables are in the schema of exactly that name, and no other was made.
        row = admin.execute(
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = %s", (schema,)
        ).fetchone()
        assert row is not None and row[0] == 3
        assert _trap_untouched(admin)
    finally:
        _drop(admin, schema)


def test_hostile_app_tenant_and_payload_are_stored_and_read_back_exactly(admin: Any) -> None:
    schema = f"{SESSION}_hostile_names"
    _drop(admin, schema)
    q = Quick.open(_url(schema))
    try:
        ran: list[tuple[str, str, object]] = []

        @q.job("t.x:y-z")
        def t(payload: object, ctx: JobContext) -> None:
            ran.append((ctx.zone.app, ctx.zone.tenant, payload))

        for name in HOSTILE_NAMES:
            q.enqueue("t.x:y-z", {"n": name}, app=name, tenant=name[::-1])
        assert q.run_until_idle() == len(HOSTILE_NAMES)
        assert sorted(ran, key=repr) == sorted(
            [(n, n[::-1], {"n": n}) for n in HOSTILE_NAMES], key=repr
        )
        assert _trap_untouched(admin)
    finally:
        q.close()
        _drop(admin, schema)


@pytest.mark.parametrize(
    ("schema", "says"),
    [
        ("é" * 32, "64 bytes"),
        ("x" * 64, "64 bytes"),
        ("a\x00b", "NUL"),
    ],
)
def test_a_schema_name_postgresql_cannot_hold_is_refused_at_open(
    admin: Any, schema: str, says: str
) -> None:
    before = admin.execute("SELECT count(*) FROM pg_namespace").fetchone()
    with pytest.raises(InvalidStoreURL) as caught:
        Quick.open(_url(schema))
    assert says in str(caught.value) and "schema" in str(caught.value)
    # Nothing was made under a truncated name.
    assert admin.execute("SELECT count(*) FROM pg_namespace").fetchone() == before
