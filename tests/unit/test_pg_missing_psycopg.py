"""Without psycopg, a ``postgresql://`` URL says which extra to install (issue 41 point
13): the error named an entry point that "failed to load". psycopg stays installed; each
check runs in a child interpreter whose ``sys.modules['psycopg']`` is None, which makes
``import psycopg`` fail as if it were absent."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

URL = "postgresql://quick@127.0.0.1:1/quick"
HINT = "pip install 'quickzones[postgres]'"
WITHOUT_PSYCOPG = "import sys; sys.modules['psycopg'] = None\n"


def _child(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", WITHOUT_PSYCOPG + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("scheme", ["postgresql", "postgres"])
def test_opening_the_url_names_the_extra(scheme: str) -> None:
    out = _child(
        f"""
        from quickzones.client import Quick
        from quickzones.errors import MissingDependency
        try:
            Quick.open({URL.replace("postgresql", scheme)!r})
        except MissingDependency as err:
            print("MissingDependency:", err)
        """
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("MissingDependency:"), out.stdout + out.stderr
    assert HINT in out.stdout
    assert "failed to load" not in out.stdout


def test_the_cli_names_the_extra() -> None:
    out = _child(
        f"""
        import sys
        from quickzones.cli import main
        sys.argv = ["quick", "--store", {URL!r}, "stats"]
        main()
        """
    )
    assert out.returncode != 0
    assert HINT in out.stdout + out.stderr, out.stdout + out.stderr
    assert "Traceback" not in out.stderr, out.stderr
