"""The layering holds: the core (``quick_core/``, installed as ``quickzones``) never imports
an adapter, a backend or a driver. Implementations register themselves (entry points
``quickzones.stores``, ``quickzones.elections``, ``quickzones.cli``); the core loads them by
scheme or command name only (``quickzones.schemes``, the ``quick`` group)."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CORE = ROOT / "quick_core"

# HTTP belongs to the HTTP adapter (adapters/http), never to the core.
HTTP = ("fastapi", "starlette", "uvicorn", "httpx", "jinja2", "pydantic")

# What the core must not import: the implementation layers and the drivers they wrap.
# fdb.tuple is the key encoding (pure Python, no libfdb_c), so the core may import it.
FORBIDDEN = (
    "quickzones.adapters",
    "quickzones.backends",
    "sqlite3",
    "redis",
    "pymemcache",
    "cassandra",
    "docker",
    "testcontainers",
    "psycopg",
    "fdb",
    *HTTP,
)
FDB_ALLOWED = ("fdb.tuple",)

# Core modules allowed to break the rule, each with its reason. Keep this short: only
# quick_core/testing may import a driver at all.
ALLOWED: dict[str, tuple[str, ...]] = {
    # Provisioning (quickzones.testing.provision): real servers for the pytest plugin's service
    # fixtures and the integration suites. Each module imports its driver when called,
    # never at import time (checked below).
    "testing/provision/docker.py": ("docker", "testcontainers"),
    "testing/provision/cassandra.py": ("cassandra",),
    "testing/provision/fdb.py": ("fdb",),
    "testing/provision/postgres.py": ("testcontainers",),
}


def _module_name(path: Path, core: Path = CORE) -> str:
    parts = list(path.relative_to(core).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(["quickzones", *parts])


def _is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def _imported(node: ast.AST, path: Path, core: Path) -> list[str]:
    """Every module name an import statement (or importlib call with a literal) names."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom):
        if node.level:
            # A relative import resolved against this module's package.
            package = _module_name(path, core).split(".")
            if not _is_package(path):
                package.pop()
            base = ".".join(package[: len(package) - (node.level - 1)])
            module = f"{base}.{node.module}" if node.module else base
        else:
            module = node.module or ""
        # Each imported name as if a submodule: ``from fdb import tuple`` is fdb.tuple,
        # ``from quickzones import backends`` is quickzones.backends, ``from redis import
        # Redis`` is under redis.
        return [f"{module}.{alias.name}" for alias in node.names]
    if isinstance(node, ast.Call) and node.args:
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        arg = node.args[0]
        if name in {"import_module", "__import__"} and isinstance(arg, ast.Constant):
            return [str(arg.value)]
    return []


def _forbidden(module: str) -> str | None:
    for prefix in FORBIDDEN:
        if module == prefix or module.startswith(prefix + "."):
            if prefix == "fdb" and any(
                module == ok or module.startswith(ok + ".") for ok in FDB_ALLOWED
            ):
                return None
            return prefix
    return None


def _docstrings(tree: ast.AST) -> set[int]:
    ids: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
    return ids


def layering_violations(core: Path = CORE) -> list[str]:
    """``path:line imports|names module`` for each violation, in file and line order."""
    found: list[tuple[str, int, str]] = []
    for path in sorted(core.rglob("*.py")):
        rel = path.relative_to(core).as_posix()
        allowed = ALLOWED.get(rel, ())
        tree = ast.parse(path.read_text(), filename=str(path))
        docstrings = _docstrings(tree)
        for node in ast.walk(tree):
            line = getattr(node, "lineno", 0)
            # One finding per statement, for its first forbidden name.
            bad = [m for m in _imported(node, path, core) if _forbidden(m) not in (None, *allowed)]
            if bad:
                found.append((rel, line, f"imports {bad[0]}"))
            # A module path in a string is an import by another name (the old scheme table
            # named backends this way); docstrings may still mention them.
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                named = _forbidden(node.value.split(":")[0])
                if (
                    named in ("quickzones.adapters", "quickzones.backends")
                    and named not in allowed
                    and id(node) not in docstrings
                ):
                    found.append((rel, line, f"names {node.value!r}"))
    return [f"{rel}:{line} {what}" for rel, line, what in sorted(found)]


def test_the_core_imports_no_adapter_backend_or_driver() -> None:
    assert layering_violations() == []


def test_the_checker_sees_every_import_form(tmp_path: Path) -> None:
    core = tmp_path / "quick_core"
    (core / "sub").mkdir(parents=True)
    (core / "__init__.py").write_text("")
    (core / "sub" / "__init__.py").write_text("")
    (core / "fine.py").write_text(
        '"""Docstrings may name quickzones.backends.memory."""\n'
        "import fdb.tuple as fdbtuple\nfrom fdb import tuple\nfrom fdb.tuple import pack\n"
        "from quickzones import schemes\nfrom . import urls\nimport sqlite3x\n"
    )
    (core / "sub" / "bad.py").write_text(
        "import fdb\n"
        "from fdb import impl\n"
        "import redis.client\n"
        "from pymemcache.client.base import Client\n"
        "def f():\n    import cassandra.cluster\n"
        "from .. import backends\n"
        "from quickzones.adapters.redis import RedisElection\n"
        "import importlib\nimportlib.import_module('docker')\n"
        "TABLE = {'memory': 'quickzones.backends.memory:MemoryStore'}\n"
    )
    assert layering_violations(core) == [
        "sub/bad.py:1 imports fdb",
        "sub/bad.py:2 imports fdb.impl",
        "sub/bad.py:3 imports redis.client",
        "sub/bad.py:4 imports pymemcache.client.base.Client",
        "sub/bad.py:6 imports cassandra.cluster",
        "sub/bad.py:7 imports quickzones.backends",
        "sub/bad.py:8 imports quickzones.adapters.redis.RedisElection",
        "sub/bad.py:10 imports docker",
        "sub/bad.py:11 names 'quickzones.backends.memory:MemoryStore'",
    ]


def test_the_allow_list_names_existing_modules() -> None:
    # A moved or renamed module must leave the list, not silently keep its exemption.
    for rel in ALLOWED:
        assert (CORE / rel).is_file(), rel


def _modules_after(code: str) -> list[str]:
    """The forbidden modules (drivers and implementation layers) a fresh interpreter holds
    after running ``code``."""
    probe = (
        f"{code}\n"
        "import json, sys\n"
        f"prefixes = {FORBIDDEN!r} + ('_sqlite3',)\n"
        "print(json.dumps(sorted(m for m in sys.modules\n"
        "    if any(m == p or m.startswith(p + '.') for p in prefixes))))\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stderr
    loaded: list[str] = json.loads(res.stdout.strip().splitlines()[-1])
    return loaded


def test_importing_quickzones_and_its_cli_loads_no_driver() -> None:
    # Importing fdb.tuple brings in the fdb package itself and nothing more; the core may
    # load what that does, never the C binding (fdb.impl) or another driver.
    baseline = set(_modules_after("import fdb.tuple"))
    loaded = set(_modules_after("import quickzones, quickzones.cli"))
    assert loaded - baseline == set()


def test_every_core_module_imports_without_a_driver() -> None:
    # Drivers are imported where a server is opened, never at import time: even the
    # provisioning module and the pytest plugin import none.
    baseline = set(_modules_after("import fdb.tuple"))
    code = (
        "import importlib, pkgutil, quickzones\n"
        "for m in pkgutil.walk_packages(quickzones.__path__, 'quickzones.'):\n"
        "    if not m.name.endswith('__main__'):\n"
        "        importlib.import_module(m.name)\n"
    )
    loaded = {m for m in _modules_after(code) if not m.startswith("quickzones.")}
    assert loaded - baseline == set()


def test_quick_help_loads_the_adapter_commands_but_no_driver() -> None:
    baseline = set(_modules_after("import fdb.tuple"))
    code = (
        "import contextlib, io\n"
        "from quickzones.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()) as out:\n"
        "    main(['--help'], standalone_mode=False)\n"
        "assert 'migrate' in out.getvalue()\n"
    )
    loaded = set(_modules_after(code))
    assert "quickzones.adapters.cassandra.cli" in loaded  # registered, so it was listed
    assert "quickzones.adapters.http.cli" in loaded
    # Listing a command loads no driver, and no web framework: FastAPI comes with the
    # app that ``quick serve`` runs (``quick --help`` took 0.7 s with it, 0.2 s without).
    drivers = {m for m in loaded - baseline if not m.startswith("quickzones.")}
    assert drivers == set()


def test_only_the_testing_package_may_import_a_driver() -> None:
    # Drivers and servers for tests live in quick_core/testing; the rest of the core is
    # the library a producer imports, and the HTTP server is an adapter (adapters/http).
    assert all(rel.startswith("testing/") for rel in ALLOWED), sorted(ALLOWED)
    assert not (CORE / "serve").exists()


# The HTTP adapter (adapters/http) reaches the consumer only through named seams (issue 40
# point 7): the pull leaser (Algorithms 1 and 2 for remote workers, through the consumer's
# own Scanner and Fetcher: quickzones.consumer.pull_leaser) and the settler (every outcome:
# quickzones.consumer.settler), with what they take and give (their config, clusters and
# works, slots). A route that chose pointers, built its own admission (tenant_admission,
# visit_gate, selection, the ZoneVisitor) or its own retry decision would write a rule a
# second time, and the two paths would drift apart: an app limited to 1 running item got 5
# leased through the pull API.
HTTP_ADAPTER = ROOT / "adapters" / "http"
CONSUMER_SEAMS = {
    "quickzones.consumer.pull_leaser",
    "quickzones.consumer.settler",
    "quickzones.consumer.config",
    "quickzones.consumer.state",
    "quickzones.consumer.slots",
    "quickzones.consumer.maintenance",
}
# The remote worker (quick worker --remote) is the consumer's Algorithm 3 wired over HTTP
# in one place: the one module that may build a Worker, its lease extender and routing.
CONSUMER_WIRING = {
    "worker.py": {
        "quickzones.consumer.worker",
        "quickzones.consumer.lease_extender",
        "quickzones.consumer.routing",
        "quickzones.consumer.pickups",  # its pickup stats count as the consumer's do
    },
    # quick serve stands in its cluster's in-order scanner election for the remote workers
    # that pull through it (issue 40 point 5): the consumer's own election, not a copy.
    "in_order.py": {
        "quickzones.consumer.election",
        "quickzones.consumer.scanner_election",
    },
}


def http_adapter_reaches(adapter: Path = HTTP_ADAPTER) -> list[str]:
    """``file:line imports module`` for each consumer module an HTTP adapter file imports
    beyond the seams."""
    found = []
    for path in sorted(adapter.rglob("*.py")):
        rel = path.relative_to(adapter).as_posix()
        allowed = CONSUMER_SEAMS | CONSUMER_WIRING.get(rel, set())
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            for name in _imported(node, path, adapter):
                if not name.startswith("quickzones.consumer"):
                    continue
                # The module, whether imported as a module or a name from it.
                parts = name.split(".")
                module = ".".join(parts[:3])
                if module == "quickzones.consumer" and len(parts) == 3:
                    module = name  # `from quickzones.consumer import x`: x is the module
                if len(parts) == 2 or module not in allowed:
                    found.append(f"{rel}:{getattr(node, 'lineno', 0)} imports {name}")
    return found


def test_the_http_adapter_reaches_the_consumer_only_through_its_seams() -> None:
    assert http_adapter_reaches() == []


def test_the_seam_check_sees_a_reach_around(tmp_path: Path) -> None:
    (tmp_path / "pull.py").write_text(
        "from quickzones.consumer.tenant_admission import TenantAdmission\n"
        "from quickzones.consumer.fetcher import Fetcher\n"
        "import quickzones.consumer.failure\n"
        "from quickzones.consumer.worker import Worker\n"
        "from quickzones.consumer.pull_leaser import PullLeaser\n"
    )
    assert http_adapter_reaches(tmp_path) == [
        "pull.py:1 imports quickzones.consumer.tenant_admission.TenantAdmission",
        "pull.py:2 imports quickzones.consumer.fetcher.Fetcher",
        "pull.py:3 imports quickzones.consumer.failure",
        "pull.py:4 imports quickzones.consumer.worker.Worker",
    ]


def test_the_seams_name_existing_modules() -> None:
    for module in CONSUMER_SEAMS | set().union(*CONSUMER_WIRING.values()):
        assert (CORE / "consumer" / f"{module.split('.')[-1]}.py").is_file(), module
    for rel in CONSUMER_WIRING:
        assert (HTTP_ADAPTER / rel).is_file(), rel


# The native SQL design (docs/backends.md, "Zones native in SQL: the design", step 1):
# items and pointers are the zone store's and the top-level queue's to lay out, so code
# above them names none of their keys. What still reaches them is listed here, each with
# the seam that takes it over; the list only shrinks (an entry that no longer reaches
# fails the test, so it is struck when its seam lands).
ITEM_AND_POINTER_KEYS = re.compile(
    r"\.(pointer_key|pointer_vested_range|pointer_vesting_key|pointer_vesting_prefix"
    r"|unpack_pointer_vesting_key|pointer_index_range|pointer_index_key|item_key|order_key"
    r"|count_key|items_range|order_range|all_zones_range|shard_prefix|cluster_prefix)\("
    r"|keys\.root\b"
)
ABOVE_THE_STORES = ("quick_core/consumer", "adapters/http")
STILL_REACHING = {
    # The app's item figures (a scan of its zones' keys from (root, "z", app)): an item
    # scan of the ZoneStore's own.
    "adapters/http/views.py",
}


def key_readers(roots: tuple[str, ...] = ABOVE_THE_STORES) -> set[str]:
    """Files under ``roots`` that build or parse an item's or a pointer's key."""
    found = set()
    for root in roots:
        for path in sorted((ROOT / root).rglob("*.py")):
            if ITEM_AND_POINTER_KEYS.search(path.read_text(encoding="utf-8")):
                found.add(path.relative_to(ROOT).as_posix())
    return found


def test_code_above_the_stores_names_no_item_or_pointer_key() -> None:
    assert key_readers() == STILL_REACHING
