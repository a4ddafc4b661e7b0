"""The FDB backend: the missing-library error, URL parsing, error and option mapping, prefixes.

Everything runs without libfdb_c: FDBStore is driven through ``quickzones.backends.fdb.sim`` (the
``fdb`` module stand-in over MemoryStore) or a small recording fake of the binding.
"""

from __future__ import annotations

import ctypes.util
import inspect
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from quickzones.backends.fdb import FDBOptions, FDBStore, MissingFDBClient, parse_fdb_url
from quickzones.backends.fdb.sim import FDBError, SimFDB, open_sim_store, sim_module
from quickzones.backends.memory import MemoryStore
from quickzones.client import Quick
from quickzones.clock import ManualClock
from quickzones.errors import ConfigurationError, InvalidStoreURL, MissingDependency
from quickzones.store.kv import (
    COMMIT_UNKNOWN_RESULT,
    KEY_OUTSIDE_LEGAL_RANGE,
    NOT_COMMITTED,
    TRANSACTION_CANCELLED,
    KVError,
    KVStore,
    run,
)
from quickzones.testing.provision import fdb_skip_reason
from tests.contract import test_kv_conformance as conformance

REPO = Path(__file__).resolve().parents[2]
# A FoundationDB build found for the real-fdb tests (quickzones.testing.provision) loads its
# libfdb_c into this process once any of them ran; the subprocess twin of the test below, in
# test_fdb_loader.py, keeps the missing-library error covered there.
HAS_LIBFDB_C = ctypes.util.find_library("fdb_c") is not None or fdb_skip_reason() is None


def sim_store(clock: ManualClock | None = None, **options: Any) -> FDBStore:
    return open_sim_store(clock=clock or ManualClock(), seed=7, **options)


# --- the missing client library ---------------------------------------------------------


@pytest.mark.skipif(HAS_LIBFDB_C, reason="libfdb_c is installed here; the error cannot occur")
def test_opening_fdb_without_libfdb_c_raises_one_clear_error() -> None:
    from quickzones.urls import open_kv

    with pytest.raises(MissingFDBClient) as info:
        open_kv("fdb://")
    err = info.value
    assert isinstance(err, MissingDependency) and isinstance(err, ConfigurationError)
    assert err.package == "libfdb_c"
    message = str(err)
    assert "libfdb_c" in message and "foundationdb-clients" in message
    assert "github.com/apple/foundationdb/releases" in message
    assert "pip install foundationdb" in message
    assert err.__cause__ is not None  # the binding's own loader error, for the curious
    # A second attempt says the same thing (no half-initialised binding state).
    with pytest.raises(MissingFDBClient):
        FDBStore.from_url("fdb:///nonexistent/fdb.cluster")


def test_importing_the_library_loads_no_fdb_c_layer() -> None:
    code = (
        "import sys, quickzones.backends.fdb, quickzones.backends.fdb.sim;"
        "import quickzones.client, quickzones.urls;"
        "assert 'fdb.impl' not in sys.modules, 'fdb.impl imported';"
        "import fdb; assert not fdb.is_api_version_selected()"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


# --- URL parsing -------------------------------------------------------------------------


def test_default_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FDB_CLUSTER_FILE", raising=False)
    parsed = parse_fdb_url("fdb://")
    assert parsed.options == FDBOptions()
    assert parsed.options.cluster_file is None  # libfdb_c picks its platform default
    assert parsed.options.api_version == 730 and parsed.options.causal_read_risky
    assert parsed.sim_url is None


def test_fdb_cluster_file_env_is_honoured_and_an_explicit_path_wins(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FDB_CLUSTER_FILE", "/from/env/fdb.cluster")
    assert parse_fdb_url("fdb://").options.cluster_file == "/from/env/fdb.cluster"
    explicit = parse_fdb_url("fdb:///etc/foundationdb/fdb.cluster")
    assert explicit.options.cluster_file == "/etc/foundationdb/fdb.cluster"
    assert parse_fdb_url("fdb:///a%20b/fdb.cluster").options.cluster_file == "/a b/fdb.cluster"


def test_all_query_options() -> None:
    options = parse_fdb_url(
        "fdb:///c?api_version=710&root=%15%2Aq&timeout_ms=2500&retry_limit=-1"
        "&max_retry_delay_ms=200&causal_read_risky=0&snapshot_reads=off"
    ).options
    assert options == FDBOptions(
        cluster_file="/c",
        api_version=710,
        root=b"\x15*q",
        timeout_ms=2500,
        retry_limit=-1,
        max_retry_delay_ms=200,
        causal_read_risky=False,
        snapshot_reads=False,
    )
    assert parse_fdb_url("fdb://?directory=app,quick").options.directory == ("app", "quick")


def test_fdbsim_forwards_simulator_options() -> None:
    parsed = parse_fdb_url("fdbsim://shared?seed=5&fault_not_committed=0.1&root=r")
    assert parsed.sim_url == "memory://shared?seed=5&fault_not_committed=0.1"
    assert parsed.options.root == b"r" and parsed.options.cluster_file is None


@pytest.mark.parametrize(
    ("url", "fragment"),
    [
        ("fdb://somehost:4500", "names a cluster file"),
        ("fdb://?bogus=1", "unknown option 'bogus'"),
        ("fdb://?seed=1", "unknown option 'seed'"),  # simulator-only option
        ("fdb://?api_version=600", "must be >= 610"),
        ("fdb://?api_version=x", "not an integer"),
        ("fdb://?timeout_ms=-5", "must be >= 0"),
        ("fdb://?causal_read_risky=maybe", "must be 1 or 0"),
        ("fdb://?root=a&directory=b", "exclusive"),
        ("fdb://?root=%FFx", "system keyspace"),
        ("fdb://?directory=", "needs a path"),
        ("fdb://?root=a&root=b", "given twice"),
        ("fdbsim:///path", "no path"),
        ("sqlite:///x", "expected the fdb"),
    ],
)
def test_bad_urls_are_rejected(url: str, fragment: str) -> None:
    with pytest.raises(InvalidStoreURL) as info:
        parse_fdb_url(url)
    assert fragment in str(info.value)


# --- opening: api_version once, cluster file, database options ----------------------------


def test_api_version_is_selected_once_on_first_open() -> None:
    fdb = sim_module()
    assert not fdb.is_api_version_selected()
    FDBStore(FDBOptions(cluster_file="/x/fdb.cluster"), fdb_module=fdb)
    FDBStore(FDBOptions(cluster_file="/x/fdb.cluster"), fdb_module=fdb)
    assert fdb.get_api_version() == 730
    assert fdb.opened == ["/x/fdb.cluster", "/x/fdb.cluster"]


def test_an_api_version_the_application_selected_is_kept() -> None:
    fdb = sim_module()
    fdb.api_version(710)
    store = FDBStore(FDBOptions(api_version=730), fdb_module=fdb)
    assert store.api_version == 710


def test_an_api_version_the_client_cannot_serve_is_a_configuration_error() -> None:
    fdb = sim_module(max_api_version=710)
    with pytest.raises(ConfigurationError) as info:
        FDBStore(FDBOptions(api_version=730), fdb_module=fdb)
    assert "730" in str(info.value) and "api_version=" in str(info.value)


def test_fdbsim_url_opens_an_fdbstore_over_the_simulator() -> None:
    clock = ManualClock()
    store = FDBStore.from_url("fdbsim://?seed=3&timeout_ms=1000", clock=clock)
    assert isinstance(store.fdb, SimFDB)
    assert store.fdb.store.clock is clock and store.fdb.store.seed == 3
    assert store.db.options.timeout_ms == 1000
    run(store, lambda tr: tr.set(b"k", b"v"))
    assert run(store, lambda tr: tr.get(b"k")) == b"v"


# --- error mapping -----------------------------------------------------------------------


def test_binding_errors_become_kverror_with_the_same_code_and_cause() -> None:
    store = sim_store()
    tr1, tr2 = store.create_transaction(), store.create_transaction()
    tr1.get(b"k")
    tr1.set(b"k", b"1")
    tr2.set(b"k", b"2")
    tr2.commit()
    with pytest.raises(KVError) as info:
        tr1.commit()
    err = info.value
    assert err.code == NOT_COMMITTED and err.retryable and not err.maybe_committed
    assert isinstance(err.__cause__, FDBError) and err.__cause__.code == NOT_COMMITTED
    assert "(1020)" in str(err)


class _Fake:
    """A recording fake of the binding for what the simulator cannot show."""

    class FDBError(Exception):
        def __init__(self, code: int) -> None:
            super().__init__(code)
            self.code = code

        @property
        def description(self) -> bytes:  # libfdb_c hands back bytes (c_char_p)
            return b"Operation aborted because the transaction timed out"

    def __init__(self, fail_on: Callable[[str], int | None]) -> None:
        self.fail_on = fail_on
        self.calls: list[tuple[str, tuple[object, ...]]] = []
        self.options = self
        self.snapshot = self

    def api_version(self, v: int) -> None: ...

    def is_api_version_selected(self) -> bool:
        return False

    def open(self, cluster_file: str | None) -> _Fake:
        return self

    def create_transaction(self) -> _Fake:
        return self

    def __getattr__(self, name: str) -> Callable[..., Any]:
        def call(*args: object) -> Any:
            self.calls.append((name, args))
            code = self.fail_on(name)
            if code is not None:
                raise _Fake.FDBError(code)
            return self

        return call


def test_byte_descriptions_from_libfdb_c_are_decoded() -> None:
    fake = _Fake(lambda name: 1031 if name == "commit" else None)
    tr = FDBStore(fdb_module=fake).create_transaction()
    with pytest.raises(KVError) as info:
        tr.commit()
    assert info.value.code == 1031
    assert str(info.value) == (
        "transaction_timed_out (1031): Operation aborted because the transaction timed out"
    )


def test_on_error_passes_the_code_and_reraises_the_callers_error() -> None:
    fake = _Fake(lambda name: 2101 if name == "on_error" else None)
    tr = FDBStore(fdb_module=fake).create_transaction()
    original = KVError(2101, "too large")
    with pytest.raises(KVError) as info:
        tr.on_error(original)
    assert info.value is original
    assert ("on_error", (2101,)) in fake.calls


def test_on_error_retries_retryable_errors_and_resets() -> None:
    store = sim_store()
    tr = store.create_transaction()
    tr.set(b"k", b"v")
    tr.on_error(KVError(COMMIT_UNKNOWN_RESULT))
    tr.commit()  # reset: the buffered write is gone, so this is a read-only no-op
    assert run(store, lambda t: t.get(b"k")) is None


def test_cancel_maps_to_transaction_cancelled() -> None:
    tr = sim_store().create_transaction()
    tr.cancel()
    with pytest.raises(KVError) as info:
        tr.get(b"k")
    assert info.value.code == TRANSACTION_CANCELLED


# --- option mapping ----------------------------------------------------------------------


def _calls(tr: Any) -> list[tuple[str, int | None]]:
    calls: list[tuple[str, int | None]] = tr._tr.options.calls
    return calls


def test_transaction_options_map_to_binding_options() -> None:
    tr = sim_store().create_transaction()
    tr.set_timeout(250)
    tr.set_retry_limit(3)
    tr.set_max_retry_delay(40)
    tr.set_causal_read_risky()
    assert _calls(tr) == [
        ("timeout", 250),
        ("retry_limit", 3),
        ("max_retry_delay", 40),
        ("causal_read_risky", None),
    ]


def test_causal_read_risky_can_be_switched_off_and_is_never_database_wide() -> None:
    on = sim_store()
    off = sim_store(causal_read_risky=False)
    for store in (on, off):
        assert store.db.options.causal_read_risky is False
        plain = store.create_transaction()
        assert _calls(plain) == []  # only transactions the core marks get it
    tr = off.create_transaction()
    tr.set_causal_read_risky()
    assert _calls(tr) == []


@pytest.mark.parametrize("snapshot_reads", [True, False])
def test_snapshot_reads_can_be_switched_off(snapshot_reads: bool) -> None:
    store = sim_store(snapshot_reads=snapshot_reads)
    reader, writer = store.create_transaction(), store.create_transaction()
    reader.get(b"k", snapshot=True)
    reader.get_range(b"r", b"s", snapshot=True)
    reader.set(b"mine", b"1")
    writer.set(b"k", b"2")
    writer.set(b"r1", b"2")
    writer.commit()
    if snapshot_reads:
        reader.commit()  # no read conflict: the writer cannot abort it
        return
    with pytest.raises(KVError) as info:
        reader.commit()
    assert info.value.code == 1020


def test_url_defaults_become_database_options_that_survive_reset() -> None:
    clock = ManualClock()
    store = sim_store(clock, timeout_ms=1000, retry_limit=2, max_retry_delay_ms=50)
    opts = store.db.options
    assert (opts.timeout_ms, opts.retry_limit, opts.max_retry_delay_ms) == (1000, 2, 50)
    tr = store.create_transaction()
    tr.reset()
    clock.advance(1.5)
    with pytest.raises(KVError) as info:
        tr.get(b"k")
    assert info.value.code == 1031  # the database default timeout was re-applied on reset


def test_retry_limit_from_the_url_stops_run() -> None:
    store = sim_store(retry_limit=2)
    attempts = []

    def body(tr: Any) -> None:
        attempts.append(1)
        raise KVError(NOT_COMMITTED)

    with pytest.raises(KVError):
        run(store, body)
    assert len(attempts) == 3


# --- key prefixes ------------------------------------------------------------------------


def test_root_prefix_is_added_and_stripped() -> None:
    store = sim_store(root=b"\x15\x2a")
    mem: MemoryStore = store.fdb.store
    run(store, lambda tr: tr.set(b"a", b"1"))
    assert mem.snapshot_items() == {b"\x15*a": b"1"}
    assert run(store, lambda tr: tr.get_range(b"", b"\xff")) == [(b"a", b"1")]
    tr = store.create_transaction()
    with pytest.raises(KVError) as info:
        tr.set(b"\xff/x", b"v")
    assert info.value.code == KEY_OUTSIDE_LEGAL_RANGE


def test_versionstamped_key_offset_moves_by_the_prefix() -> None:
    store = sim_store(root=b"pre/")
    tr = store.create_transaction()
    tr.set_versionstamped_key(b"log/" + b"\x00" * 10 + b"!" + struct.pack("<I", 4), b"x")
    stamp = tr.get_versionstamp()
    tr.commit()
    assert store.fdb.store.snapshot_items() == {b"pre/log/" + stamp.result() + b"!": b"x"}


def test_directory_prefix_is_allocated_once_per_path() -> None:
    mem = MemoryStore(clock=ManualClock())
    fdb = sim_module(mem)
    a = FDBStore(FDBOptions(directory=("app", "quick")), fdb_module=fdb)
    b = FDBStore(FDBOptions(directory=("app", "quick")), fdb_module=fdb)
    c = FDBStore(FDBOptions(directory=("app", "other")), fdb_module=fdb)
    assert a.prefix == b.prefix != c.prefix
    run(a, lambda tr: tr.set(b"k", b"v"))
    assert run(b, lambda tr: tr.get(b"k")) == b"v"
    assert run(c, lambda tr: tr.get(b"k")) is None


# The whole conformance suite once more under a root prefix, where key translation can go
# wrong. The exact key-size test is left out: a prefix shortens the longest usable key.
PREFIX_CASES = sorted(
    name
    for name, fn in vars(conformance).items()
    if name.startswith("test_") and callable(fn) and name != "test_key_and_value_size_limits"
)


@pytest.mark.parametrize("name", PREFIX_CASES)
def test_conformance_under_a_root_prefix(name: str) -> None:
    clock = ManualClock()
    store: KVStore = sim_store(clock, root=b"\x15\x2a")
    fn = getattr(conformance, name)
    fixtures = {"kv_store": store, "manual_clock": clock, "clock": clock}
    fn(**{p: fixtures[p] for p in inspect.signature(fn).parameters})
    store.close()


# --- QuiCK on FDBStore-over-sim -----------------------------------------------------------


def test_quick_enqueue_and_consume_over_fdbsim() -> None:
    clock = ManualClock()
    q = Quick(FDBStore.from_url("fdbsim://?root=%02app%00", clock=clock), clock=clock)
    seen: list[int] = []
    q.job("job")(lambda payload, ctx: seen.append(payload["i"]))
    for i in range(10):
        q.enqueue("job", {"i": i}, app="app", tenant=f"t{i % 3}")
    assert q.run_until_idle() == 10
    assert sorted(seen) == list(range(10))
    q.close()
