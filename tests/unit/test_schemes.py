"""Store and election schemes come from a registry the implementations fill (entry points
``quickzones.stores`` / ``quickzones.elections``) and a third party can extend."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from quickzones import schemes
from quickzones.client import Quick
from quickzones.clock import Clock
from quickzones.errors import InvalidArgument, InvalidStoreURL, QuickError
from quickzones.store.kv import KVStore
from quickzones.urls import open_election, open_kv

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def restore_registry() -> Iterator[None]:
    """Schemes a test registers do not leak into the next test."""
    saved = {kind: dict(table) for kind, table in schemes._REGISTERED.items()}
    yield
    for kind, table in schemes._REGISTERED.items():
        table.clear()
        table.update(saved[kind])


def test_a_third_party_store_scheme_opens_through_quick_open() -> None:
    from quickzones.backends.memory import MemoryStore

    opened: list[str] = []

    def factory(url: str, *, clock: Clock | None = None) -> KVStore:
        opened.append(url)
        return MemoryStore.from_url("memory://", clock=clock)

    schemes.register_store_scheme("x", factory)
    q = Quick.open("x://somewhere/else")
    try:
        ran: list[bytes] = []
        q.job("job")(lambda payload, ctx: ran.append(payload))
        q.enqueue("job", b"hello", app="a", tenant="t")
        assert q.run_until_idle() == 1
        assert ran == [b"hello"]
    finally:
        q.close()
    assert opened == ["x://somewhere/else"]
    assert "x" in schemes.store_schemes()


def test_a_third_party_election_scheme_opens() -> None:
    from quickzones.consumer.election import LocalElection

    schemes.register_election_scheme("myelect", lambda url, *, clock=None: LocalElection())
    assert isinstance(open_election("myelect://host"), LocalElection)


def test_unknown_scheme_is_a_clear_error_listing_the_known_ones() -> None:
    schemes.register_store_scheme("x", lambda url, *, clock=None: open_kv("memory://"))
    with pytest.raises(InvalidStoreURL) as info:
        Quick.open("nosuch://host/db")
    message = str(info.value)
    assert "unknown scheme 'nosuch'" in message
    for known in ("memory://", "sqlite://", "fdb://", "fdbsim://", "x://"):
        assert known in message
    with pytest.raises(InvalidStoreURL) as info:
        open_election("memory://")
    assert "redis://" in str(info.value) and "memcached://" in str(info.value)


@pytest.mark.parametrize("name", ["", "1abc", "has space", "UPPER", "x://", "a/b", None])
def test_a_bad_scheme_name_is_refused(name: Any) -> None:
    with pytest.raises(InvalidArgument):
        schemes.register_store_scheme(name, lambda url, *, clock=None: open_kv("memory://"))


def test_a_factory_must_be_callable() -> None:
    with pytest.raises(InvalidArgument):
        schemes.register_store_scheme("x", "quickzones.backends.memory:MemoryStore")  # type: ignore[arg-type]


def test_registering_a_taken_scheme_needs_replace(tmp_path: Path) -> None:
    def factory(url: str, *, clock: Clock | None = None) -> KVStore:
        return open_kv(f"sqlite:///{tmp_path / 'q.db'}")

    with pytest.raises(QuickError) as info:
        schemes.register_store_scheme("memory", factory)
    assert "memory" in str(info.value) and "replace=True" in str(info.value)
    schemes.register_store_scheme("x", factory)
    with pytest.raises(QuickError):
        schemes.register_store_scheme("x", factory)
    schemes.register_store_scheme("memory", factory, replace=True)
    store = open_kv("memory://")
    assert type(store).__name__ == "SQLiteStore"
    store.close()


def test_the_builtin_schemes_are_entry_points_declared_in_pyproject() -> None:
    """The core names no backend: the package's metadata does, and each entry loads to a
    factory taking ``(url, clock=...)``."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    stores = project["entry-points"]["quickzones.stores"]
    elections = project["entry-points"]["quickzones.elections"]
    assert {"memory", "sqlite", "fdb", "fdbsim"} <= set(stores)
    assert {"redis", "rediss", "memcached"} <= set(elections)
    assert set(stores) <= set(schemes.store_schemes())
    assert set(elections) <= set(schemes.election_schemes())


def _fake_distribution(site: Path, entry_points: str, module: str) -> None:
    """A third-party distribution on sys.path: a module and its dist-info."""
    (site / "thirdparty_quick.py").write_text(textwrap.dedent(module))
    info = site / "thirdparty_quick-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: thirdparty-quick\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(textwrap.dedent(entry_points))


def _run(code: str, site: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(site)}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=site,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_an_installed_third_party_scheme_opens_and_loads_only_when_used(
    tmp_path: Path,
) -> None:
    _fake_distribution(
        tmp_path,
        """
        [quickzones.stores]
        thirdkv = thirdparty_quick:open_store
        """,
        """
        from quickzones.backends.memory import MemoryStore

        def open_store(url, *, clock=None):
            return MemoryStore.from_url("memory://", clock=clock)
        """,
    )
    res = _run(
        """
        import sys
        from quickzones import Quick
        q = Quick.open("memory://")
        q.close()
        assert "thirdparty_quick" not in sys.modules, "loaded before its scheme was opened"
        assert "quickzones.backends.sqlite" not in sys.modules, "sqlite loaded for memory://"
        q = Quick.open("thirdkv://anything")
        q.job("job")(lambda payload, ctx: None)
        q.enqueue("job", b"x", app="a", tenant="t")
        assert q.run_until_idle() == 1
        q.close()
        assert "thirdparty_quick" in sys.modules
        print("ok")
        """,
        tmp_path,
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "ok"


def test_a_scheme_whose_entry_point_fails_to_load_is_a_clear_error(tmp_path: Path) -> None:
    _fake_distribution(
        tmp_path,
        """
        [quickzones.stores]
        broken = thirdparty_quick:open_store
        """,
        "raise ImportError('needs the frobnicator driver')\n",
    )
    res = _run(
        """
        from quickzones import Quick
        from quickzones.errors import ConfigurationError
        try:
            Quick.open("broken://x")
        except ConfigurationError as err:
            print(type(err).__name__, err)
        Quick.open("memory://").close()  # the others still open
        """,
        tmp_path,
    )
    assert res.returncode == 0, res.stderr
    assert "broken" in res.stdout and "thirdparty_quick:open_store" in res.stdout
    assert "frobnicator" in res.stdout


def test_an_install_without_the_entry_points_says_to_reinstall(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Metadata from before the schemes were entry points (an old editable install) leaves
    no scheme at all: the error says so instead of listing nothing."""
    monkeypatch.setattr(schemes, "entry_points", lambda group: [])
    monkeypatch.setattr(schemes, "_REGISTERED", {schemes.STORES: {}, schemes.ELECTIONS: {}})
    monkeypatch.setattr(schemes, "_DECLARED", {})
    monkeypatch.setattr(schemes, "_LOADED", {})
    with pytest.raises(InvalidStoreURL) as info:
        Quick.open("memory://")
    message = str(info.value)
    assert "no store schemes are registered" in message and "reinstall" in message
    assert "'quickzones.stores'" in message
