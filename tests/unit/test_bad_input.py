"""Bad input is one clear error, never a traceback (issue 12 points 15 and 16).

The CLI cases run the installed ``quick`` script as a user would, with bytes arguments where
the fault is a byte that is not UTF-8; each must print one ``error: ...`` line on stderr and
exit with status 2."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from quickzones.client import Quick
from quickzones.errors import InvalidArgument
from quickzones.registry import JobContext
from quickzones.store.records import ZoneId
from quickzones.store.validation import MAX_JSON_DEPTH
from quickzones.store.zonestore import NewItem

QUICK = Path(sys.executable).with_name("quick")


# --- the Python API --------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    ["a\x85b", "a\u2028b", "a\u2029b", "a\ud800b", "a\udcffb", "a\x9fb", "\x00", "a\nb"],
    ids=["NEL", "LS", "PS", "surrogate", "escaped-byte", "C1", "NUL", "newline"],
)
def test_names_refuse_control_and_unencodable_characters(q: Quick, name: str) -> None:
    for kind in ("app", "tenant", "item_id"):
        args = {"app": "a", "tenant": "t", "item_id": "i", kind: name}
        with pytest.raises(InvalidArgument) as info:
            q.enqueue("job", None, **args)  # type: ignore[arg-type]
        assert info.value.name == kind
    assert q.dead_letters() == []


@pytest.mark.parametrize("job_type", ["job\n", "job\r\n", "jo\nb", "job\x85"])
def test_job_types_refuse_a_trailing_newline(q: Quick, job_type: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        q.enqueue(job_type, None, app="a", tenant="t")
    assert info.value.name == "job_type"


def test_deeply_nested_payload_is_invalid_argument(q: Quick) -> None:
    deep: list[object] = []
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(InvalidArgument) as info:
        q.enqueue("job", deep, app="a", tenant="t")
    assert info.value.name == "payload"


def test_huge_integer_payload_is_invalid_argument(q: Quick) -> None:
    with pytest.raises(InvalidArgument):
        q.enqueue("job", {"n": 10**5000}, app="a", tenant="t")


def test_json_is_stored_as_utf8(q: Quick) -> None:
    """600 KB of non-ASCII text fits under the 1 MiB limit (ASCII escapes made it 1.8 MB)."""
    text = "é" * 300_000  # 600,000 bytes in UTF-8
    seen: list[str] = []

    @q.job("job")
    def job(payload: dict[str, str], ctx: JobContext) -> None:
        seen.append(payload["t"])

    item_id = q.enqueue("job", {"t": text}, app="a", tenant="t")
    stored = q.get("a", "t", item_id)
    assert stored is not None
    assert stored.payload == json.dumps({"t": text}, ensure_ascii=False).replace(" ", "").encode()
    assert len(stored.payload) < 600_100
    q.run_until_idle()
    assert seen == [text]


def test_a_json_payload_that_could_not_be_sent_back_is_refused(q: Quick) -> None:
    """UTF-8 cannot hold a lone surrogate, nor the HTTP API's encoder nesting past
    MAX_JSON_DEPTH: such payloads are refused at enqueue (issue 28, point 2), not stored
    to break every lease that hands them out."""
    q.job("job")(lambda payload, ctx: None)
    deep: object = 1
    for _ in range(MAX_JSON_DEPTH + 1):
        deep = [deep]
    for payload, why in [({"s": "a\ud800b"}, "lone surrogate (U+D800)"), (deep, "nested")]:
        with pytest.raises(InvalidArgument, match=re.escape(why)):
            q.enqueue("job", payload, app="a", tenant="t")
    assert q.run_until_idle() == 0
    q.enqueue("job", {"t": "日本", "s": "[[[{" * 100}, app="a", tenant="t")  # text is no nesting
    assert q.run_until_idle() == 1


def test_old_ascii_escaped_records_still_read(q: Quick) -> None:
    seen: list[object] = []

    @q.job("job")
    def job(payload: object, ctx: JobContext) -> None:
        seen.append(payload)

    old = b'{"t":"\\u00e9\\u65e5"}'  # what earlier releases stored
    q.zones.enqueue(ZoneId("a", "t"), NewItem("job", old, content_type="json"))
    q.run_until_idle()
    assert seen == [{"t": "é日"}]


# --- the quick command -----------------------------------------------------------------


@pytest.fixture
def store(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'cli.db'}"


def quick(*args: str | bytes, cwd: Path | None = None) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "LC_ALL": "C.UTF-8", "PYTHONUTF8": "0"}
    env.pop("QUICK_STORE", None)
    return subprocess.run(
        [str(QUICK), *args], capture_output=True, timeout=120, env=env, cwd=cwd, check=False
    )


def assert_one_line_error(proc: subprocess.CompletedProcess[bytes], *needles: str) -> None:
    err = proc.stderr.decode("utf-8", "replace")
    assert proc.returncode == 2, (proc.returncode, err)
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for needle in needles:
        assert needle in lines[0], err


ENQ = ("enqueue", "--app", "a", "--tenant", "t", "--job-type", "j")


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        ((b"--app", b"a\xff", b"--tenant", b"t", b"--job-type", b"j"), "app"),
        ((b"--app", b"a", b"--tenant", b"\xc3", b"--job-type", b"j"), "tenant"),
        ((b"--app", b"a", b"--tenant", b"t", b"--job-type", b"j\xfe"), "job"),
        ((b"--app", b"a", b"--tenant", b"t", b"--job-type", b"j", b"--payload", b'"\xff"'), ""),
        ((b"--app", b"a", b"--tenant", b"t", b"--job-type", b"j", b"--id", b"\xed\xa0\x80"), "id"),
    ],
    ids=["app", "tenant", "job-type", "payload", "id"],
)
def test_cli_non_utf8_bytes(store: str, args: tuple[bytes, ...], needle: str) -> None:
    Quick.open(store).close()  # an existing store: the refusal must leave it as it was
    proc = quick(b"enqueue", b"--store", store.encode(), *args)
    assert_one_line_error(proc, needle, "UTF-8")
    assert json.loads(quick("stats", "--store", store, "--json").stdout)["by_app"] == {}


def test_cli_non_utf8_store_url(tmp_path: Path) -> None:
    assert_one_line_error(quick(b"stats", b"--store", b"sqlite:///" + bytes(tmp_path) + b"/\xff"))


def test_cli_non_utf8_dead_letter_filter(store: str) -> None:
    assert_one_line_error(quick(b"dead-letters", b"list", b"--store", store.encode(),
                                b"--tenant", b"\xff"))  # fmt: skip
    assert_one_line_error(quick(b"dead-letters", b"purge", b"--store", store.encode(),
                                b"--app", b"\xff"))  # fmt: skip


@pytest.mark.parametrize(
    ("payload", "needle"),
    [("[" * 20_000 + "]" * 20_000, "nested"), ("1" * 5000, "digits"), ('{"a": 1e999}', "")],
    ids=["nested", "big-int", "inf"],
)
def test_cli_payloads(store: str, payload: str, needle: str) -> None:
    assert_one_line_error(quick(*ENQ, "--store", store, "--payload", payload), "payload", needle)


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--job-type", "job\n"),
        ("--app", "a\x85"),
        ("--tenant", "t\u2028"),
        ("--id", "i\u2029"),
        ("--app", "a\x9b"),
    ],
    ids=["job-type-newline", "app-NEL", "tenant-LS", "id-PS", "app-CSI"],
)
def test_cli_control_characters(store: str, flag: str, value: str) -> None:
    args = {"--app": "a", "--tenant": "t", "--job-type": "j", flag: value}
    flat = [x for kv in args.items() for x in kv]
    assert_one_line_error(quick("enqueue", "--store", store, *flat), "invalid")


@pytest.fixture
def busy_port() -> Iterator[int]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1)
    try:
        yield int(sock.getsockname()[1])
    finally:
        sock.close()


def test_cli_metrics_port_in_use(tmp_path: Path, busy_port: int) -> None:
    pytest.importorskip("prometheus_client")
    (tmp_path / "handlers.py").write_text(
        "from quickzones import Quick\n"
        f"quick = Quick.open('sqlite:///{tmp_path / 'w.db'}')\n"
        "@quick.job('j')\n"
        "def j(payload, ctx):\n"
        "    pass\n"
    )
    proc = quick(
        "worker", "--app-module", "handlers", "--metrics-port", str(busy_port), cwd=tmp_path
    )
    assert_one_line_error(proc, str(busy_port))
