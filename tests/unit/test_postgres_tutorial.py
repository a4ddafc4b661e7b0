"""docs/tutorial-postgres-transaction.md runs: its ``python no-run postgres`` blocks (no-run
for the docs suite, which has no database) are run here, in page order, against the
session's PostgreSQL with ``DATABASE_URL`` naming a fresh database."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from quickzones.testing.provision.postgres import postgres_skip_reason, shared_postgres_url
from tests.docs.test_examples import DOCS, blocks
from tests.postgres import SESSION

pytestmark = pytest.mark.skipif(
    postgres_skip_reason() is not None, reason=str(postgres_skip_reason())
)
PAGE = DOCS / "tutorial-postgres-transaction.md"


@pytest.fixture
def database_url() -> Iterator[str]:
    import psycopg

    server = shared_postgres_url()
    name = f"{SESSION}_shop"
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    yield server.rsplit("/", 1)[0] + f"/{name}"
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


def test_the_tutorial_runs(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("fastapi")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DATABASE_URL", database_url)
    namespace: dict[str, object] = {"__name__": "docs_tutorial_postgres"}
    ran = 0
    for block in blocks(PAGE):
        if block.info.split() != ["python", "no-run", "postgres"]:
            continue
        exec(compile(block.code, f"{block.page}:{block.line}", "exec"), namespace)
        ran += 1
    assert ran == 2
    quick = namespace["quick"]
    quick.close()  # type: ignore[attr-defined]
    namespace["engine"].dispose()  # type: ignore[attr-defined]
