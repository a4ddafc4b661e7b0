"""Sessions: tests, lint, typecheck, demo, bench, simulate, docs."""

from __future__ import annotations

import shutil

import nox

nox.options.sessions = ["lint", "typecheck", "tests"]
nox.options.reuse_existing_virtualenvs = True


@nox.session(python="3.11")
def tests(session: nox.Session) -> None:
    """Every suite; servers (Redis, memcached, Cassandra) are started by the suites."""
    session.install("-e", ".[dev]")
    session.run("pytest", "-q", *session.posargs)


@nox.session(python="3.11")
def lint(session: nox.Session) -> None:
    session.install("ruff>=0.5")
    session.run("ruff", "check", "quick_core", "backends", "adapters")


@nox.session(python="3.11")
def typecheck(session: nox.Session) -> None:
    session.install("-e", ".[dev]")
    session.run("mypy")


@nox.session(python="3.11")
def demo(session: nox.Session) -> None:
    session.install("-e", ".")
    session.run("quick", "demo", *session.posargs)


@nox.session(python="3.11")
def bench(session: nox.Session) -> None:
    """Benchmarks against the peers; results go to bench/results/<timestamp>/ and the
    report to bench/REPORT.md. Needs redis-server and PostgreSQL from Debian."""
    missing = [b for b in ("redis-server", "pg_ctlcluster") if shutil.which(b) is None]
    if missing:
        session.run("apt-get", "update", "-qq", external=True)
        session.run("apt-get", "install", "-y", "-qq", "redis-server", "postgresql", external=True)
    session.install("-e", ".[dev]", "-r", "bench/requirements.txt")
    session.run("python", "-m", "bench", *session.posargs)


@nox.session(python="3.11")
def simulate(session: nox.Session) -> None:
    """Deterministic simulation: ``nox -s simulate -- --seeds 1000``."""
    session.install("-e", ".[dev]")
    session.run("python", "-m", "quick_core.simulation", *session.posargs)


@nox.session(python="3.11")
def docs(session: nox.Session) -> None:
    """Build the site into build/site with warnings as errors; then run its code examples."""
    session.install("-e", ".[dev]", "mkdocs>=1.6", "mkdocs-material>=9.5")
    session.run("mkdocs", "build", "--strict", env={"NO_MKDOCS_2_WARNING": "1"})
    session.run("pytest", "-q", "tests/docs")
