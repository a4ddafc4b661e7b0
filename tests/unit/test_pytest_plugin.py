"""The pytest plugin, used as a user would: an example suite run by ``pytester``."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest

from quickzones.client import Quick
from quickzones.clock import ManualClock
from quickzones.registry import JobContext, RetryPolicy
from quickzones.testing import run_until_idle

pytest_plugins = ["pytester"]

# The suite a user of quick would write: their app registers handlers on a Quick it is
# given, the test drives it with the plugin's fixtures and nothing else.
USER_APP = """
from quickzones.client import Quick

def make_app(q: Quick, outbox: list) -> Quick:
    @q.job("welcome")
    def welcome(payload, ctx):
        outbox.append((ctx.tenant, payload["to"]))
        q.enqueue("reminder", {"to": payload["to"]}, app="mail", tenant=ctx.tenant, delay=86400)

    @q.job("reminder")
    def reminder(payload, ctx):
        outbox.append(("reminder", payload["to"]))

    return q
"""

USER_TESTS = """
import asyncio

from quickzones.aio import AsyncQuick
from quickzones.testing.pytest_plugin import run_until_idle
from user_app import make_app


def test_welcome_mail_sent_once(quick, quick_clock):
    outbox = []
    make_app(quick, outbox)
    quick.enqueue("welcome", {"to": "a@example.com"}, app="mail", tenant="u1")
    assert quick.run_until_idle() == 1
    assert outbox == [("u1", "a@example.com")]
    quick_clock.advance(86400)
    assert run_until_idle(quick) == 1
    assert outbox[-1] == ("reminder", "a@example.com")


def test_advance_clock_runs_delayed_work(quick, quick_run_until_idle):
    outbox = []
    make_app(quick, outbox)
    quick.enqueue("welcome", {"to": "b@example.com"}, app="mail", tenant="u2")
    assert quick_run_until_idle(advance_clock=True) == 2
    assert [o[0] for o in outbox] == ["u2", "reminder"]


def test_async_handlers_with_the_same_fixture(quick):
    aq = AsyncQuick(quick)
    seen = []

    @aq.job("ping")
    async def ping(payload, ctx):
        await asyncio.sleep(0)
        seen.append(payload)

    async def main():
        await aq.enqueue("ping", {"n": 1}, app="a", tenant="t")
        return await aq.run_until_idle()

    assert asyncio.run(main()) == 1 and seen == [{"n": 1}]


def test_each_test_gets_a_fresh_store(quick):
    assert quick.run_until_idle() == 0


def test_redis_fixture_skips_or_serves(quick_redis_url):
    assert quick_redis_url.startswith(("redis://", "rediss://"))
"""


def _entry_point_installed() -> bool:
    eps = importlib.metadata.entry_points(group="pytest11")
    return any(ep.value == "quickzones.testing.pytest_plugin" for ep in eps if ep.name == "quick")


def _load_plugin() -> list[str]:
    # Installed (pip install -e .), pytest autoloads the plugin and refuses a second -p;
    # from a bare checkout, name it so these tests still run.
    return [] if _entry_point_installed() else ["-p", "quickzones.testing.pytest_plugin"]


def test_entry_point_is_declared() -> None:
    text = (Path(__file__).parents[2] / "pyproject.toml").read_text()
    assert '[project.entry-points.pytest11]\nquick = "quickzones.testing.pytest_plugin"' in text


def test_user_suite_passes_with_the_plugin(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(user_app=USER_APP, test_user=USER_TESTS)
    result = pytester.runpytest(*_load_plugin(), "-q")
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) == 0 and outcomes.get("errors", 0) == 0, result.stdout.str()
    assert outcomes["passed"] >= 4


def test_unavailable_service_skips_with_one_reason(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Nothing can be found: no Docker, no env, no binaries on PATH, no local ports.
    monkeypatch.setenv("PATH", str(pytester.path))
    monkeypatch.delenv("QUICK_CASSANDRA_CONTACT_POINTS", raising=False)
    monkeypatch.delenv("CASSANDRA_CONTACT_POINTS", raising=False)
    pytester.makeconftest(
        # In-process: patched for the inner session only, then put back.
        "import pytest\n"
        "from quickzones.testing.provision import cassandra, docker, ports, process\n"
        "@pytest.fixture(autouse=True, scope='session')\n"
        "def nothing_found():\n"
        "    with pytest.MonkeyPatch.context() as mp:\n"
        "        mp.setattr(docker, 'docker_available', lambda *a, **k: False)\n"
        "        mp.setattr(process, 'find_binary', lambda name: None)\n"
        "        mp.setattr(ports, 'answers', lambda *a, **k: False)\n"
        "        mp.setattr(cassandra, 'cql_ready', lambda *a, **k: False)\n"
        "        yield\n"
    )
    pytester.makepyfile(
        "def test_cassandra(quick_cassandra):\n    pass\n"
        "def test_memcached(quick_memcached_url):\n    pass\n"
    )
    result = pytester.runpytest(*_load_plugin(), "-rs")
    result.assert_outcomes(skipped=2)
    result.stdout.fnmatch_lines(["*cassandra unavailable: no Docker engine*"])
    result.stdout.fnmatch_lines(["*memcached unavailable: no Docker engine*"])


def test_plugin_fixture_names_do_not_clash_with_project_fixtures(
    request: pytest.FixtureRequest,
) -> None:
    from quickzones.testing import pytest_plugin
    names = set(vars(pytest_plugin))
    assert {"quick", "quick_clock", "quick_store_url", "quick_redis_url"} <= names
    assert not {"clock", "backend", "q"} & names
    # Both sets of fixtures resolve side by side in this suite.
    assert isinstance(request.getfixturevalue("quick_clock"), ManualClock)
    assert isinstance(request.getfixturevalue("clock"), ManualClock)


def test_run_until_idle_advances_through_backoff(tmp_path: Path) -> None:
    """The helper on the project's own SQLite store: retries land in dead letters."""
    q = Quick.open(f"sqlite:///{tmp_path / 'q.db'}", clock=ManualClock())
    calls: list[int] = []

    @q.job("flaky", retry=RetryPolicy(max_attempts=3, backoff_base_s=10, jitter=False))
    def flaky(payload: object, ctx: JobContext) -> None:
        calls.append(ctx.attempt)
        raise RuntimeError("down")

    q.enqueue("flaky", b"", app="a", tenant="t")
    assert run_until_idle(q, advance_clock=True) == 3
    assert calls == [1, 2, 3] and len(q.dead_letters()) == 1
    q.close()


def test_plugin_fixtures_in_this_suite(quick: Quick, quick_clock: ManualClock) -> None:
    seen: list[int] = []
    quick.job("job")(lambda payload, ctx: seen.append(payload["n"]))
    quick.enqueue("job", {"n": 1}, app="a", tenant="t", delay=5)
    assert quick.run_until_idle() == 0
    quick_clock.advance(5.01)
    assert quick.run_until_idle() == 1 and seen == [1]
