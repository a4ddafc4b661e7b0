"""Property-based bad input over the public API and the CLI: every input either works or
gets a specific error, and nothing already stored is lost."""

from __future__ import annotations

import math

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from quickzones.cli import main
from quickzones.client import Quick
from quickzones.clock import ManualClock
from quickzones.errors import ConfigurationError, InvalidArgument, QuickError
from quickzones.store.records import ZoneId
from quickzones.store.validation import MAX_ID_LENGTH
from quickzones.urls import open_kv

SETTINGS = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@pytest.fixture(scope="module")
def mq() -> Quick:
    q = Quick.open("memory://", clock=ManualClock(), max_payload=4096)
    q.enqueue("keep", b"precious", app="keep", tenant="keep", item_id="keep-1")
    return q


def assert_kept(q: Quick) -> None:
    item = q.get("keep", "keep", "keep-1")
    assert item is not None and item.payload == b"precious"


@SETTINGS
@given(app=st.text(max_size=300), tenant=st.text(max_size=300), item_id=st.text(max_size=300))
def test_names(mq: Quick, app: str, tenant: str, item_id: str) -> None:
    def ok(s: str) -> bool:
        # Issue 12.15: C1 controls (U+0080-U+009F), U+2028/U+2029 and surrogates are refused
        # too, besides C0 and DEL.
        return 0 < len(s) <= MAX_ID_LENGTH and all(
            ord(c) >= 0x20
            and not 0x7F <= ord(c) <= 0x9F
            and c not in "\u2028\u2029"
            and not 0xD800 <= ord(c) <= 0xDFFF
            for c in s
        )

    try:
        got = mq.enqueue("job", b"x", app=app, tenant=tenant, item_id=item_id)
    except InvalidArgument:
        assert not (ok(app) and ok(tenant) and ok(item_id))
    else:
        assert ok(app) and ok(tenant) and ok(item_id) and got == item_id
        item = mq.get(app, tenant, item_id)
        assert item is not None and item.payload == b"x"
        mq.cancel(app, tenant, item_id)
    assert_kept(mq)


@SETTINGS
@given(size=st.integers(min_value=4096 - 3, max_value=4096 + 3))
def test_payload_sizes_around_the_limit(mq: Quick, size: int) -> None:
    try:
        item_id = mq.enqueue("job", b"p" * size, app="a", tenant="sizes")
    except InvalidArgument:
        assert size > 4096
    else:
        assert size <= 4096
        item = mq.get("a", "sizes", item_id)
        assert item is not None and len(item.payload) == size
    assert_kept(mq)


@SETTINGS
@given(
    delay=st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(), st.text()),
    priority=st.one_of(st.integers(), st.floats(), st.booleans()),
)
def test_delays_and_priorities(mq: Quick, delay: object, priority: object) -> None:
    try:
        mq.enqueue("job", b"", app="a", tenant="dp", delay=delay, priority=priority)  # type: ignore[arg-type]
    except InvalidArgument:
        valid_delay = (
            isinstance(delay, int | float)
            and not isinstance(delay, bool)
            and math.isfinite(delay)
            and 0 <= delay <= 10 * 365 * 24 * 3600
        )
        valid_priority = (
            isinstance(priority, int)
            and not isinstance(priority, bool)
            and abs(priority) <= 1_000_000
        )
        assert not (valid_delay and valid_priority)
    assert_kept(mq)


@SETTINGS
@given(url=st.text(max_size=60))
def test_store_urls(url: str) -> None:
    try:
        store = open_kv(url)
    except ConfigurationError:
        return
    except QuickError:
        return
    store.close()  # some random text may be a valid URL (memory://...)


@SETTINGS
@given(raw=st.binary(max_size=200))
def test_corrupt_records_are_dead_lettered_and_never_block(raw: bytes) -> None:
    q = Quick.open("memory://", clock=ManualClock())
    seen: list[str] = []
    q.job("job")(lambda payload, ctx: seen.append(ctx.item_id))
    good = q.enqueue("job", b"", app="a", tenant="t", priority=5)
    bad = q.enqueue("job", b"", app="a", tenant="t", priority=0)
    tr = q.kv.create_transaction()
    tr.set(q.keys.item_key(ZoneId("a", "t"), bad), raw)
    tr.commit()
    q.run_until_idle()
    assert good in seen
    assert bad in seen or any(d.item_id == bad for d in q.dead_letters())
    assert q.zones.count(ZoneId("a", "t")) == 0


@settings(max_examples=60, deadline=None)
@given(
    args=st.lists(
        st.sampled_from(
            [
                "--app",
                "--tenant",
                "--job-type",
                "--payload",
                "--delay",
                "--priority",
                "--id",
                "x",
                "",
                "-1",
                "1e999",
                "{",
                "null",
                "\x00",
                "a" * 300,
            ]
        ),
        max_size=10,
    )
)
def test_cli_enqueue_never_crashes(args: list[str]) -> None:
    result = CliRunner().invoke(main, ["enqueue", "--store", "memory://", *args])
    # 0: enqueued; 2: usage error or a clear quick error. Never a traceback.
    assert result.exit_code in (0, 2), result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
