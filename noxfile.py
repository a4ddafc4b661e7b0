"""Sessions: tests, lint, typecheck, demo, bench, simulate, docs."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import nox

nox.options.sessions = ["lint", "typecheck", "tests"]
nox.options.reuse_existing_virtualenvs = True


def _fdb_binding(session: nox.Session) -> None:
    """With a FoundationDB 7.3 build beside the checkout (../shared/fdb, or FDB_BIN_DIR),
    install the binding that matches its libfdb_c: foundationdb>=7.3 resolves to 8.0,
    which refuses a 7.3 library."""
    here = Path(__file__).resolve().parent
    candidates = [Path(os.environ["FDB_BIN_DIR"])] if os.environ.get("FDB_BIN_DIR") else []
    candidates += [p / "shared" / "fdb" / "bin" for p in here.parents]
    if any((c / "fdbserver").is_file() for c in candidates):
        session.install("foundationdb>=7.3,<7.4")


@nox.session(python="3.11")
def tests(session: nox.Session) -> None:
    """Every suite; servers (Redis, memcached, Cassandra, FoundationDB) are started by the
    suites."""
    session.install("-e", ".[dev]")
    _fdb_binding(session)
    session.run("pytest", "-q", *session.posargs)


@nox.session(python="3.11")
def lint(session: nox.Session) -> None:
    session.install("ruff>=0.5")
    session.run("ruff", "check", "quick_core", "backends", "adapters", "tests", "integration")


@nox.session(python="3.11")
def typecheck(session: nox.Session) -> None:
    session.install("-e", ".[dev]")
    session.run("bash", "scripts/typecheck", env={"PYTHON": "python"}, external=True)


@nox.session(python="3.11")
def demo(session: nox.Session) -> None:
    session.install("-e", ".")
    session.run("quick", "demo", *session.posargs)


@nox.session(python="3.11")
def bench(session: nox.Session) -> None:
    """Benchmarks against the peers; each run goes to an untracked
    bench/results/<timestamp>-<name>/ (``nox -s bench -- --publish`` also rewrites
    bench/REPORT.md; bench/results/README.md says how a cited run is kept). Needs
    redis-server, PostgreSQL and valgrind from Debian."""
    missing = [b for b in ("redis-server", "pg_ctlcluster", "valgrind") if shutil.which(b) is None]
    if missing:
        session.run("apt-get", "update", "-qq", external=True)
        session.run(
            "apt-get", "install", "-y", "-qq", "redis-server", "postgresql", "valgrind",
            external=True,
        )  # fmt: skip
    session.install("-e", ".[dev]", "-r", "bench/requirements.txt")
    _fdb_binding(session)
    session.run("python", "-m", "bench", *session.posargs)
    # What users see beside the peers, the table docs/performance.md leads with (single
    # enqueues, quick worker --workers 4 with its defaults, 3 runs): <ts>-peers-users/.
    session.run("python", "-m", "bench.peers_users")
    # Delayed items' lateness (exact timers): bench/results/<ts>-lateness/.
    session.run("python", "-m", "bench.delayed_lateness")
    # Small tenants' pickup under a noisy neighbour, 10 runs: bench/results/<ts>-noisy/.
    session.run("python", "-m", "bench.noisy_pickup")
    # quick demo as a user runs it, 5 runs, against its figures (>= 13,000 items, small
    # tenants' p99 <= 10 ms): bench/results/<ts>-demo/. With --baseline, A/B against a tree.
    session.run("python", "-m", "bench.demo")
    # Where the demo's small tenants' pickup goes (visit, then hand-off to a worker), 3 runs:
    # bench/results/<ts>-demo-pickup/.
    session.run("python", "-m", "bench.demo_pickup")
    # Instructions an enqueue and a drained item cost, counted by valgrind's callgrind: the
    # measure no host load moves (with --baseline, A/B against a tree): <ts>-instructions/.
    session.run("python", "-m", "bench.instructions")
    # quick on PostgreSQL against procrastinate on one server: bench/results/<ts>-postgres-peer/.
    session.run("python", "-m", "bench.postgres_peer")
    # Where a pickup's time goes on PostgreSQL: bench/results/<ts>-postgres-pickup/.
    session.run("python", "-m", "bench.postgres_pickup")
    # quick on PostgreSQL beside a 120 s REPEATABLE READ snapshot: dead rows, sizes, pickups,
    # with and without backends/postgres/tuning.py's settings: <ts>-pg-long-txn/.
    session.run("python", "-m", "bench.pg_long_txn")
    session.run("python", "-m", "bench.pg_long_txn", "--tuned")
    # Application transactions that enqueue, Quick.enqueue_on against a plain INSERT, 8
    # threads, W = 50 and 0 ms: bench/results/README.md says how a cited run is kept.
    session.run("python", "-m", "bench.pg_app_txn", "--seconds", "20", "--runs", "3")
    # A million other tenants (each had an item once, 100,000 with settings) beside none:
    # app b's drain and noisy neighbour, one-item tenants, quick serve's pages and RSS; the
    # big store is built once into bench/results/.cache/: <ts>-tenant-scale/.
    session.run("python", "-m", "bench.tenant_scale")
    # Consumer CPU and the server's writes per no-op item on FoundationDB: <ts>-fdb-cpu/.
    session.run("python", "-m", "bench.fdb_cpu")


@nox.session(python="3.11")
def simulate(session: nox.Session) -> None:
    """Deterministic simulation: ``nox -s simulate -- --seeds 1000``."""
    session.install("-e", ".[dev]")
    session.run("python", "-m", "quickzones.testing.simulation", *session.posargs)


@nox.session(python="3.11")
def docs(session: nox.Session) -> None:
    """Build the site into build/site with warnings as errors; then run its code examples."""
    session.install("-e", ".[dev]", "mkdocs>=1.6", "mkdocs-material>=9.5")
    session.run("mkdocs", "build", "--strict", env={"NO_MKDOCS_2_WARNING": "1"})
    session.run("pytest", "-q", "tests/docs")
