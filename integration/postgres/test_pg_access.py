"""A store URL naming what the server refuses says what is wrong and is not retryable
(issue 41 point 9): a database or role that does not exist was ``database_locked (1038)``
marked retryable, and a schema its role may not use blamed the database. Each case runs
against a private server with its own roles."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from quickzones.client import Quick
from quickzones.errors import StoreMisconfigured
from quickzones.testing.provision.postgres import LocalPostgres, find_pg_bin, postgres_required

psycopg = pytest.importorskip("psycopg")


@pytest.fixture(scope="module")
def server() -> Iterator[LocalPostgres]:
    if find_pg_bin() is None:
        if postgres_required():
            pytest.fail("QUICK_REQUIRE_POSTGRES is set but there is no initdb", pytrace=False)
        pytest.skip("no PostgreSQL (initdb) here")
    pg = LocalPostgres().start()
    with psycopg.connect(pg.url, autocommit=True) as admin:
        admin.execute("CREATE ROLE outsider LOGIN")
    # A quick store made by the server's owner, which outsider has no USAGE on.
    Quick.open(pg.url + "?schema=owned").close()
    yield pg
    pg.close()


def _as(pg: LocalPostgres, role: str, database: str = "postgres", schema: str = "quick") -> str:
    return f"postgresql://{role}@127.0.0.1:{pg.port}/{database}?schema={schema}"


def _refusal(url: str) -> StoreMisconfigured:
    with pytest.raises(StoreMisconfigured) as caught:
        Quick.open(url)
    err = caught.value
    assert err.retryable is False
    assert "database_locked" not in str(err) and "1038" not in str(err)
    return err


def test_a_database_that_does_not_exist_is_named(server: LocalPostgres) -> None:
    err = _refusal(_as(server, "postgres", database="nosuchdb"))
    assert 'database "nosuchdb" does not exist' in str(err)


def test_a_role_that_does_not_exist_is_named(server: LocalPostgres) -> None:
    err = _refusal(_as(server, "nobody"))
    assert 'role "nobody" does not exist' in str(err)


def test_a_schema_without_usage_names_the_schema_and_the_role(server: LocalPostgres) -> None:
    err = _refusal(_as(server, "outsider", schema="owned"))
    assert 'no USAGE privilege on schema "owned"' in str(err)
    assert 'role "outsider"' in str(err)


def test_a_role_that_may_not_create_the_schema_is_told_so(server: LocalPostgres) -> None:
    err = _refusal(_as(server, "outsider", schema="fresh"))
    assert 'may not create schema "fresh"' in str(err)
    assert 'role "outsider"' in str(err) and 'database "postgres"' in str(err)


def test_the_cli_says_the_same(server: LocalPostgres) -> None:
    from click.testing import CliRunner

    from quickzones.cli import main

    out = CliRunner().invoke(main, ["--store", _as(server, "postgres", "nosuchdb"), "stats"])
    assert out.exit_code != 0
    assert 'database "nosuchdb" does not exist' in out.output, out.output
