"""``quick`` command groups are registered by their implementations (entry point group
``quickzones.cli``): the Cassandra adapter owns ``quick cassandra ...`` and ``quick migrate``,
and a third party can add its own group without the core knowing it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from quickzones.cli import main


def _quick(*args: str, site: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if site is not None:
        env["PYTHONPATH"] = str(site)
    return subprocess.run(
        [sys.executable, "-m", "quickzones", *args],
        cwd=site,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _fake_distribution(site: Path, entry_points: str, module: str) -> None:
    """A third-party distribution on sys.path: a module and its dist-info."""
    (site / "thirdparty_cli.py").write_text(textwrap.dedent(module))
    info = site / "thirdparty_cli-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: thirdparty-cli\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(textwrap.dedent(entry_points))


def test_the_cassandra_commands_belong_to_the_adapter() -> None:
    ctx = click.Context(main)
    for name in ("cassandra", "migrate"):
        command = main.get_command(ctx, name)
        assert command is not None, name
        assert command.callback is not None
        assert command.callback.__module__ == "quickzones.adapters.cassandra.cli", name
    group = main.get_command(ctx, "cassandra")
    assert isinstance(group, click.Group)
    assert set(group.list_commands(ctx)) == {"init", "repair"}


def test_quick_help_still_lists_the_adapter_commands() -> None:
    res = _quick("--help")
    assert res.returncode == 0, res.stderr
    assert "cassandra     Cassandra zones: work items in Cassandra" in res.stdout
    assert "migrate       Move queued items from Cassandra zones" in res.stdout
    for builtin in ("dead-letters", "enqueue", "move-tenant", "stats", "worker", "zones"):
        assert f"  {builtin} " in res.stdout


def test_the_moved_commands_behave_as_before() -> None:
    res = CliRunner().invoke(main, ["migrate", "--from", "foo://x", "--to", "memory://"])
    assert res.exit_code == 2
    assert res.stderr.strip() == (
        "error: invalid store URL 'foo://x': expected the cassandra:// scheme"
    )
    res = CliRunner().invoke(main, ["cassandra", "repair", "--help"])
    assert res.exit_code == 0 and "--pointer-store" in res.stdout
    res = CliRunner().invoke(main, ["cassandra", "init"])
    assert res.exit_code == 2 and "Missing option '--contact-points'" in res.stderr


def test_a_third_party_command_group_is_listed_and_runs(tmp_path: Path) -> None:
    _fake_distribution(
        tmp_path,
        """
        [quickzones.cli]
        hello = thirdparty_cli:hello
        """,
        """
        import click
        from quickzones.cli import friendly, store_option
        from quickzones.errors import ConfigurationError

        @click.group()
        def hello():
            '''Greetings from a third party.'''

        @hello.command()
        @store_option
        @click.option("--name", default="world")
        @friendly
        def say(store, name):
            if name == "nobody":
                raise ConfigurationError("nobody to greet")
            click.echo(f"hello {name} on {store}")
        """,
    )
    helped = _quick("--help", site=tmp_path)
    assert helped.returncode == 0, helped.stderr
    assert "hello         Greetings from a third party." in helped.stdout
    ran = _quick("--store", "memory://", "hello", "say", "--name", "you", site=tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout == "hello you on memory://\n"
    refused = _quick("hello", "say", "--name", "nobody", site=tmp_path)
    assert refused.returncode == 2
    assert refused.stderr == "error: nobody to greet\n"
    # The core loads a group only when it is listed or run.
    code = (
        "import sys; from quickzones.cli import main;"
        "main(['stats', '--store', 'memory://'], standalone_mode=False);"
        "assert 'thirdparty_cli' not in sys.modules;"
        "assert 'quickzones.adapters.cassandra.cli' not in sys.modules"
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    res = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert res.returncode == 0, res.stderr


def test_a_broken_third_party_group_does_not_break_quick(tmp_path: Path) -> None:
    _fake_distribution(
        tmp_path,
        """
        [quickzones.cli]
        broken = thirdparty_cli:group
        notacommand = thirdparty_cli:NOT_A_COMMAND
        """,
        """
        NOT_A_COMMAND = 42
        def __getattr__(name):
            raise ImportError("needs the frobnicator package")
        """,
    )
    helped = _quick("--help", site=tmp_path)
    assert helped.returncode == 0, helped.stderr
    assert "broken        (unavailable)" in helped.stdout
    assert "enqueue" in helped.stdout and "migrate" in helped.stdout
    ran = _quick("broken", site=tmp_path)
    assert ran.returncode == 2
    assert ran.stderr.startswith("error: command 'broken' (entry point thirdparty_cli:group")
    assert "frobnicator" in ran.stderr and ran.stderr.count("\n") == 1
    ran = _quick("notacommand", "--flag", site=tmp_path)
    assert ran.returncode == 2
    assert "is not a click command" in ran.stderr and ran.stderr.count("\n") == 1


def test_a_third_party_group_cannot_replace_a_builtin(tmp_path: Path) -> None:
    _fake_distribution(
        tmp_path,
        """
        [quickzones.cli]
        stats = thirdparty_cli:stats
        """,
        """
        import click

        @click.command()
        def stats():
            click.echo("hijacked")
        """,
    )
    ran = _quick("stats", "--store", "memory://", site=tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert "hijacked" not in ran.stdout


def test_cassandra_init_with_a_host_that_does_not_resolve_is_one_line() -> None:
    pytest.importorskip("cassandra")
    res = _quick("cassandra", "init", "--contact-points", "no-such-host.invalid",
                 "--keyspace", "k")  # fmt: skip
    assert res.returncode == 2, res.stderr
    assert res.stderr.startswith(
        "error: cannot connect to Cassandra at cassandra://no-such-host.invalid:9042/k: "
        "no contact point resolves"
    )
    assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr
