"""The ``quick`` command line."""

from __future__ import annotations

import importlib
import json
import logging
import os
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from functools import wraps
from importlib.metadata import EntryPoint, entry_points
from typing import Any, TypeVar
from zoneinfo import ZoneInfo

import click
from click.core import ParameterSource

from quickzones.consumer.config import ConsumerConfig
from quickzones.errors import ConfigurationError, HandlerImportError, QuickError
from quickzones.store.records import DeadLetter

F = TypeVar("F", bound=Callable[..., Any])

DEFAULT_STORE = "sqlite:///quick.db"
_DEFAULTS = ConsumerConfig()


def _config_option(flag: str, field: str, kind: Any, help: str) -> Callable[[F], F]:
    """A ``quick worker`` option for the ConsumerConfig field ``field``, whose default
    (shown in ``--help``) is the field's."""
    return click.option(
        flag, field, type=kind, default=getattr(_DEFAULTS, field), show_default=True, help=help
    )


_STORE_HELP = (
    f"Store URL: sqlite:///path, memory://, fdb:// [env QUICK_STORE; default {DEFAULT_STORE}]"
)


def _store_option(fn: F) -> F:
    """``--store`` on a subcommand; without it the group's ``--store`` (given before the
    subcommand, or ``$QUICK_STORE``) applies, then the default."""

    @wraps(fn)
    def resolve(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("store") is None:
            root = click.get_current_context().find_root()
            kwargs["store"] = (root.obj or {}).get("store") or DEFAULT_STORE
        return fn(*args, **kwargs)

    return click.option("--store", default=None, help=_STORE_HELP)(resolve)  # type: ignore[return-value]


def _check_arguments() -> None:
    """Every text argument must be UTF-8. Python turns a byte that is not UTF-8 on the
    command line into a lone surrogate, which would fail deep inside as a traceback."""
    from quickzones.store.validation import check_utf8

    ctx: click.Context | None = click.get_current_context()
    while ctx is not None:
        for param in ctx.command.params:
            value = ctx.params.get(param.name or "")
            if isinstance(value, str):
                shown = param.opts[0] if param.opts else str(param.name)
                check_utf8(shown, value)
        ctx = ctx.parent


def _error_line(err: BaseException) -> None:
    # One line even if the message has a newline in it, and printable on any terminal.
    text = " ".join(str(err).split("\n"))
    encoding = getattr(sys.stderr, "encoding", None) or "utf-8"
    click.echo(f"error: {text}".encode(encoding, "backslashreplace").decode(encoding), err=True)


def _friendly(fn: F) -> F:
    """Every quick error becomes one clear line on stderr and exit status 2."""

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            _check_arguments()
            return fn(*args, **kwargs)
        except QuickError as err:
            _error_line(err)
            sys.exit(2)

    return wrapper  # type: ignore[return-value]


# The builders an implementation's own command group uses (see _QuickGroup): ``--store``
# resolved like the built-in commands', and QuickError as one line with exit status 2.
store_option = _store_option
friendly = _friendly

# Entry point group of command groups that implementations add to ``quick``: the name is
# the command's, the value a click command or group (``module:attr``).
COMMANDS_GROUP = "quickzones.cli"


def _unavailable(name: str, reason: str) -> click.Command:
    """Stands in for a registered command that cannot be loaded, so ``quick --help`` and
    every other command still work and running it says why, in one line."""

    def refuse(**_: Any) -> None:
        _error_line(ConfigurationError(f"command {name!r} {reason}"))
        sys.exit(2)

    return click.Command(
        name,
        callback=refuse,
        help=f"(unavailable) {reason}",
        short_help="(unavailable)",
        context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
        add_help_option=False,
    )


class _QuickGroup(click.Group):
    """The ``quick`` group: the core's commands, then those implementations register in
    the ``quickzones.cli`` entry point group (the Cassandra adapter's ``cassandra`` and
    ``migrate``, or a third party's). The core imports none of them: a registered command
    is loaded only when ``quick --help`` lists it or it runs. A built-in name wins."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._registered: dict[str, list[EntryPoint]] | None = None
        self._loaded: dict[str, click.Command] = {}

    def _entry_points(self) -> dict[str, list[EntryPoint]]:
        if self._registered is None:
            table: dict[str, list[EntryPoint]] = {}
            for ep in entry_points(group=COMMANDS_GROUP):
                same = table.setdefault(ep.name, [])
                if all(other.value != ep.value for other in same):
                    same.append(ep)
            self._registered = table
        return self._registered

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        name, command, rest = super().resolve_command(ctx, args)
        ctx.meta[_SUBCOMMAND_ARGS] = rest  # for _refuse_unused_store, before the callback
        return name, command, rest

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(self._entry_points()))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        builtin = super().get_command(ctx, cmd_name)
        if builtin is not None:
            return builtin
        if cmd_name not in self._loaded:
            candidates = self._entry_points().get(cmd_name)
            if not candidates:
                return None
            self._loaded[cmd_name] = _load_command(cmd_name, candidates)
        return self._loaded[cmd_name]


_SUBCOMMAND_ARGS = "quickzones.subcommand_args"

# Where the built-in commands without a --store take their stores from.
_STORE_ELSEWHERE = {
    "worker": "it runs the Quick that --app-module builds, on the store that Quick opened",
    "periodic": "it reads the schedules of the Quick that --app-module builds",
    "move-tenant": "it moves between the stores named by --from and --to",
}


def _uses_store(command: click.Command) -> bool:
    """True when ``command`` (every command of a group) has a ``--store`` option, which
    falls back to the group's (see :func:`_store_option`)."""
    if isinstance(command, click.Group):
        return all(_uses_store(sub) for sub in command.commands.values())
    return any(isinstance(p, click.Option) and "--store" in p.opts for p in command.params)


def _refuse_unused_store(ctx: click.Context, store: str) -> None:
    """``quick --store X cmd``: a usage error when ``cmd`` would not use X, so a store
    given on the command line is never silently ignored. ``$QUICK_STORE`` is ambient
    and not checked; ``--help`` still works."""
    name = ctx.invoked_subcommand
    group = ctx.command
    if name is None or not isinstance(group, click.Group):
        return
    command = group.get_command(ctx, name)
    rest: list[str] = ctx.meta.get(_SUBCOMMAND_ARGS, [])
    if command is None or any(h in rest for h in ctx.help_option_names):
        return
    path = [name]
    # Down a command group to the command that runs (``dead-letters list``).
    while isinstance(command, click.Group) and rest and not rest[0].startswith("-"):
        sub = command.get_command(ctx, rest[0])
        if sub is None:
            return  # click reports the unknown command
        path.append(rest[0])
        command, rest = sub, rest[1:]
    if _uses_store(command):
        return
    shown = " ".join(path)
    hint = _STORE_ELSEWHERE.get(path[0], f"see quick {shown} --help for the options it takes")
    raise click.UsageError(
        f"quick {shown} does not use --store {store}: {hint}. Drop --store.", ctx=ctx
    )


def _load_command(name: str, candidates: list[EntryPoint]) -> click.Command:
    if len(candidates) > 1:
        values = ", ".join(ep.value for ep in candidates)
        return _unavailable(name, f"is registered by more than one entry point ({values})")
    ep = candidates[0]
    try:
        command = ep.load()
    except Exception as err:  # a broken or half-installed implementation
        return _unavailable(
            name, f"(entry point {ep.value}) failed to load: {type(err).__name__}: {err}"
        )
    if not isinstance(command, click.Command):
        return _unavailable(name, f"(entry point {ep.value}) is not a click command")
    return command


@click.group(cls=_QuickGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="quickzones", prog_name="quick")
@click.option("-v", "--verbose", count=True, help="More logging (-v info, -vv debug).")
@click.option("--store", envvar="QUICK_STORE", default=None, help=_STORE_HELP)
@click.pass_context
def main(ctx: click.Context, verbose: int, store: str | None) -> None:
    """quick: QuiCK queue zones in your own database."""
    typed = store is not None and ctx.get_parameter_source("store") is ParameterSource.COMMANDLINE
    ctx.obj = {"store": store, "typed_store": store if typed else None}
    if typed and store is not None:
        _refuse_unused_store(ctx, store)
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s %(message)s")


def _open(store: str, *, create: bool = True, **options: Any) -> Any:
    """The store a command works on; commands that only read pass ``create=False`` so a
    typo or another application's file is refused, never created or converted."""
    from quickzones.client import Quick

    return Quick.open(store, create=create, **options)


@main.command()
@_store_option
@click.option("--app", required=True)
@click.option("--tenant", required=True)
@click.option("--job-type", "job_type", required=True)
@click.option("--payload", default="null", help="JSON payload (default null).")
@click.option("--delay", type=float, default=0.0, help="Seconds before the item vests.")
@click.option("--priority", type=int, default=0, help="Lower runs first.")
@click.option("--id", "item_id", default=None, help="Caller-chosen id (idempotent enqueue).")
@click.option(
    "--fifo", is_flag=True, help="Order by commit among the priority's FIFO items (KV zones)."
)
@_friendly
def enqueue(
    store: str,
    app: str,
    tenant: str,
    job_type: str,
    payload: str,
    delay: float,
    priority: int,
    item_id: str | None,
    fifo: bool,
) -> None:
    """Enqueue one item and print its id."""
    body = _parse_json("payload", payload)
    q = _open(store)
    try:
        click.echo(
            q.enqueue(
                job_type,
                body,
                app=app,
                tenant=tenant,
                delay=delay,
                priority=priority,
                item_id=item_id,
                fifo=fifo,
            )
        )
    finally:
        q.close()


def _parse_json(name: str, text: str) -> Any:
    from quickzones.errors import InvalidArgument

    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise InvalidArgument(name, text, f"not JSON: {err.msg}") from None
    except RecursionError:
        raise InvalidArgument(name, text, "JSON nested too deeply") from None
    except ValueError as err:  # an integer over Python's 4,300-digit conversion limit
        raise InvalidArgument(name, text, f"not usable JSON: {err}") from None


def load_handlers(spec: str) -> Any:
    """Import ``module`` or ``module:attr``; the attribute (default ``quick``) must be a
    :class:`Quick` with handlers registered."""
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as err:  # any import-time failure in user code
        from quickzones.consumer.failure_log import LocatedError  # names the file and line

        raise HandlerImportError(module_name, LocatedError(err)) from err
    name = attr or "quick"
    try:
        found = getattr(module, name)
    except AttributeError as err:
        raise HandlerImportError(spec, err) from err
    from quickzones.client import Quick

    inner = getattr(found, "quick", None)  # an AsyncQuick wraps its Quick
    if not isinstance(found, Quick) and isinstance(inner, Quick):
        found = inner
    if not isinstance(found, Quick):
        raise HandlerImportError(spec, TypeError(f"{name} is not a Quick or AsyncQuick"))
    return found


def _name_list(option: str, text: str | None) -> tuple[str, ...] | None:
    """A comma-separated option's names (None when not given); empty names are refused."""
    from quickzones.errors import ConfigurationError

    if text is None:
        return None
    names = tuple(part.strip() for part in text.split(","))
    if not any(names) or not all(names):
        raise ConfigurationError(
            f"{option} takes comma-separated non-empty names (e.g. {option} a,b), not {text!r}"
        )
    return names


def _seconds_or_off(value: float | None) -> str:
    return "off" if value is None else f"{value:g}s"


def _batched(visits_per_transaction: int) -> str:
    return f" (up to {visits_per_transaction} zones)" if visits_per_transaction > 1 else ""


@main.command()
@click.option("--app-module", "app_module", required=True, help="module[:attr] with a Quick.")
@click.option("--workers", type=click.IntRange(min=1), default=8, show_default=True,
              help="Handler threads.")  # fmt: skip
@click.option("--managers", type=click.IntRange(min=1), default=4, show_default=True,
              help="Zone visits at once.")  # fmt: skip
@click.option(
    "--lease",
    "lease_s",
    type=click.FloatRange(min=0, min_open=True),
    default=_DEFAULTS.item_lease_s,
    show_default=True,
    help="Item lease in seconds (extended while the handler runs).",
)
@_config_option(
    "--shutdown-deadline",
    "shutdown_deadline_s",
    click.FloatRange(min=0),
    "Seconds running handlers get to finish after SIGTERM/SIGINT.",
)
@_config_option(
    "--dequeue-max",
    "dequeue_max",
    click.IntRange(min=1),
    "Items one visit takes from one zone.",
)
@click.option("--metrics-port", type=click.IntRange(0, 65535), default=None,
              help="Serve Prometheus metrics on this port.")  # fmt: skip
@click.option("--metrics-address", default="127.0.0.1", show_default=True,
              help="Address the metrics server listens on.")  # fmt: skip
@click.option("--election", default=None,
              help="redis://... or memcached://... in front of the store's own in-order "
              "scanner lease (default: the store's alone).")  # fmt: skip
@click.option("--remote", default=None, metavar="URL",
              help="Pull items from a quick serve at URL instead of the store.")  # fmt: skip
@click.option("--token", envvar="QUICK_TOKEN", default=None,
              help="Bearer token for --remote (consume role) [env QUICK_TOKEN].")  # fmt: skip
@click.option("--apps", default=None,
              help="Comma-separated apps: only their zones are leased (default all).")  # fmt: skip
@click.option("--types", "job_types", default=None,
              help="Comma-separated job types this worker runs (default all).")  # fmt: skip
@_config_option(
    "--unhandled-grace",
    "unhandled_grace_s",
    float,
    "Seconds an item of a type no consumer handles stays due before it is "
    "dead-lettered; negative is refused.",
)
@_friendly
def worker(
    app_module: str,
    workers: int,
    managers: int,
    lease_s: float,
    shutdown_deadline_s: float,
    dequeue_max: int,
    metrics_port: int | None,
    metrics_address: str,
    election: str | None,
    remote: str | None,
    token: str | None,
    apps: str | None,
    job_types: str | None,
    unhandled_grace_s: float,
) -> None:
    """Run a consumer until SIGTERM/SIGINT.

    Every other ConsumerConfig field is set from Python:
    quick.consumer(ConsumerConfig(...)).run_forever() (docs/configuration.md).
    """
    from quickzones.errors import ConfigurationError
    from quickzones.urls import open_election

    routed_apps = _name_list("--apps", apps)
    routed_types = _name_list("--types", job_types)
    if unhandled_grace_s < 0:
        raise ConfigurationError(f"--unhandled-grace must be at least 0, not {unhandled_grace_s}")
    sys.path.insert(0, os.getcwd())
    q = load_handlers(app_module)
    if remote is not None:  # the handlers run here; the store is behind quick serve
        from urllib.parse import urlsplit

        from quickzones import schemes

        run_remote = schemes.factory(schemes.REMOTE_WORKERS, urlsplit(remote).scheme, remote)
        run_remote(q, remote, token, workers=workers, lease_s=lease_s)
        return
    config = ConsumerConfig(
        workers=workers,
        managers=managers,
        item_lease_s=lease_s,
        shutdown_deadline_s=shutdown_deadline_s,
        dequeue_max=dequeue_max,
        apps=routed_apps,
        job_types=routed_types,
        unhandled_grace_s=unhandled_grace_s,
    )
    config.validate()
    observer = None
    if metrics_port is not None:
        from quickzones.consumer.metrics import serve_metrics

        try:
            observer = serve_metrics(q, metrics_port, metrics_address)
        except OSError as err:  # the port is taken, or the address is not this host's
            raise ConfigurationError(
                f"cannot serve metrics on {metrics_address}:{metrics_port}: {err.strerror or err}"
            ) from err
    el = open_election(election) if election else None
    consumer = q.consumer(config, election=el, observer=observer)
    # Periodic schedules run in every worker: each slot is enqueued once however many tick.
    scheduler = q.scheduler() if q.schedules else None
    runs = routed_types if routed_types is not None else q.registry.names()
    click.echo(
        f"quick worker {consumer.name}: job types {', '.join(runs)}; "
        f"apps {', '.join(routed_apps) if routed_apps is not None else 'all'}; "
        f"lease {config.item_lease_s}s, dequeue_max {config.dequeue_max}, "
        f"visit_max {config.visit_max or config.dequeue_max}, "
        f"{'one transaction' if config.one_transaction_visits else 'three transactions'} "
        f"per visit{_batched(config.visits_per_transaction)}, "
        f"timer lookahead {config.timer_lookahead_s:g}s, "
        f"commit poll {_seconds_or_off(config.commit_poll_s)}, "
        f"completion flush {_seconds_or_off(config.completion_flush_s or None)}, "
        f"shutdown deadline {config.shutdown_deadline_s}s, "
        f"unhandled grace {config.unhandled_grace_s:g}s"
    )
    if scheduler is not None:
        scheduler.start()
    try:
        consumer.run_forever()
    finally:
        if scheduler is not None:
            scheduler.stop()


@main.command()
@_store_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@_friendly
def stats(store: str, as_json: bool) -> None:
    """Counts per app, tenant and job type; active zones; dead letters."""
    from rich.console import Console
    from rich.table import Table

    from quickzones.store.admin import stats as compute

    q = _open(store, create=False)
    try:
        s = compute(q)
    finally:
        q.close()
    if as_json:
        click.echo(
            json.dumps(
                {
                    "by_app": dict(s.items_by_app),
                    "by_tenant": {f"{a}/{t}": n for (a, t), n in s.items_by_zone.items()},
                    "by_job_type": dict(s.items_by_job_type),
                    "vested": s.vested,
                    "leased": s.leased,
                    "corrupt": s.corrupt,
                    "active_zones": s.active_zones,
                    "dead_letters": s.dead_letters,
                    "in_order_scanner": _scanner_json(s),
                },
                sort_keys=True,
            )
        )
        return
    console = Console()
    table = Table(title="items")
    for col in ("app", "tenant", "items"):
        table.add_column(col)
    for (app, tenant), n in sorted(s.items_by_zone.items()):
        table.add_row(app, tenant, str(n))
    console.print(table)
    by_type = ", ".join(f"{k}={v}" for k, v in sorted(s.items_by_job_type.items())) or "none"
    console.print(f"by job type: {by_type}")
    console.print(
        f"vested {s.vested}, leased {s.leased}, corrupt {s.corrupt}, "
        f"active zones {s.active_zones}, dead letters {s.dead_letters}"
    )
    console.print(_scanner_line(s), highlight=False)


def _scanner_json(s: Any) -> dict[str, Any]:
    """Who holds the top-level queue's in-order scanner lease (``quick stats --json``)."""
    lease = s.in_order_scanner
    if lease is None:
        return {"held": False, "holder": None, "term": None, "expires": None}
    return {
        "held": lease.held_at(s.read_at_ms),
        "holder": lease.holder,
        "term": lease.term,
        "expires": _when(lease.expires_ms) if lease.expires_ms else None,
    }


def _scanner_line(s: Any) -> str:
    lease = s.in_order_scanner
    if lease is None:
        return "in-order scanner: none elected yet"
    if lease.held_at(s.read_at_ms):
        left = (lease.expires_ms - s.read_at_ms) / 1000
        return f"in-order scanner: {lease.holder} (term {lease.term}, lease ends in {left:.1f}s)"
    ended = _when(lease.expires_ms) if lease.expires_ms else "released"
    return f"in-order scanner: none (last {lease.holder}, term {lease.term}, ended {ended})"


def _when(ms: int | None) -> str | None:
    """A store time (ms since the epoch) as ISO 8601 UTC, to the millisecond."""
    if ms is None:
        return None
    moment = datetime.fromtimestamp(ms / 1000, tz=UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _when_in(ms: int, tz: str) -> str:
    """A store time as ISO 8601 in time zone ``tz``, with its offset, to the second."""
    moment = datetime.fromtimestamp(ms / 1000, tz=ZoneInfo(tz))
    return moment.isoformat(timespec="seconds").replace("+00:00", "Z")


def _console() -> Any:
    from rich.console import Console

    # Piped output has no terminal width: do not fold ids and times into 80 columns.
    return Console(width=None if sys.stdout.isatty() else 250)


def _table(title: str, columns: list[str], rows: list[list[str]]) -> Any:
    from rich.table import Table

    table = Table(title=title)
    for col in columns:
        table.add_column(col, overflow="fold")
    for row in rows:
        table.add_row(*row)
    return table


@main.command()
@_store_option
@click.option("--json", "as_json", is_flag=True, help="One JSON document (a list of zones).")
@_friendly
def zones(store: str, as_json: bool) -> None:
    """Zones that have a pointer (active zones): items, lease state, next visit."""
    from quickzones.store.admin import active_zones

    q = _open(store, create=False)
    try:
        found = active_zones(q)
    finally:
        q.close()
    docs = [
        {
            "app": z.zone.app,
            "tenant": z.zone.tenant,
            "items": z.count,
            "leased": z.leased,
            "pointer_vesting_ms": z.pointer_vesting_ms,
            "pointer_vesting": _when(z.pointer_vesting_ms),
        }
        for z in found
    ]
    if as_json:
        click.echo(json.dumps(docs, ensure_ascii=False))
        return
    rows = [
        [
            str(d["app"]),
            str(d["tenant"]),
            str(d["items"]),
            "leased" if d["leased"] else "idle",
            str(d["pointer_vesting"] or ""),
        ]
        for d in docs
    ]
    _console().print(
        _table("active zones", ["app", "tenant", "items", "state", "next visit (UTC)"], rows)
    )


@main.group("periodic")
def periodic_group() -> None:
    """Periodic (cron) schedules of an app module."""


@periodic_group.command("list")
@click.option("--app-module", "app_module", required=True, help="module[:attr] with a Quick.")
@click.option("--count", type=click.IntRange(min=1, max=100), default=3, show_default=True,
              help="Next runs shown per schedule.")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="One JSON document (a list).")
@_friendly
def periodic_list(app_module: str, count: int, as_json: bool) -> None:
    """Each schedule, the last slot enqueued and the next runs (in the schedule's time
    zone, with its UTC offset; --json gives them in UTC too)."""
    sys.path.insert(0, os.getcwd())
    q = load_handlers(app_module)
    try:
        scheduler = q.scheduler()
        docs = [
            {
                "name": s.name,
                "cron": s.cron,
                "tz": s.tz,
                "job_type": s.job_type,
                "app": s.app,
                "tenant": s.tenant,
                "catch_up": s.catch_up,
                "last_enqueued": _when(scheduler.last_slot(s)),
                "next_runs": [_when(ms) for ms in runs],
                "next_runs_local": [_when_in(ms, s.tz) for ms in runs],
            }
            for s in q.schedules
            for runs in [scheduler.next_runs(s, count)]
        ]
    finally:
        q.close()
    if as_json:
        click.echo(json.dumps(docs, ensure_ascii=False))
        return
    rows = [
        [
            str(d["name"]),
            f"{d['cron']} ({d['tz']})",
            f"{d['job_type']} -> {d['app']}/{d['tenant']}",
            str(d["last_enqueued"] or ""),
            ", ".join(str(t) for t in d["next_runs_local"]),
        ]
        for d in docs
    ]
    _console().print(
        _table("periodic schedules", ["name", "cron", "job", "last enqueued", "next runs"], rows)
    )


@main.group("dead-letters")
def dead_letters() -> None:
    """List, requeue or purge dead letters."""


def _filters(app: str | None, tenant: str | None) -> tuple[str | None, str | None]:
    from quickzones.store.validation import check_name

    return (
        None if app is None else check_name("app", app),
        None if tenant is None else check_name("tenant", tenant),
    )


def _letter_doc(d: DeadLetter) -> dict[str, Any]:
    """A dead letter as JSON, with stable field names."""
    item = d.item
    doc: dict[str, Any] = {
        "app": d.zone.app,
        "tenant": d.zone.tenant,
        "item_id": d.item_id,
        "reason": d.reason,
        "dead_at_ms": d.dead_at_ms,
        "dead_at": _when(d.dead_at_ms),
        "traceback": d.traceback,
        "corrupt": item is None,
        "job_type": None,
        "attempts": None,
        "error_count": None,
        "last_error": None,
        "enqueued_at_ms": None,
        "enqueued_at": None,
        "priority": None,
        "content_type": None,
        "payload_bytes": None,
    }
    if item is not None:
        doc.update(
            job_type=item.job_type,
            attempts=item.attempts,
            error_count=item.error_count,
            last_error=item.last_error,
            enqueued_at_ms=item.enqueued_ms,
            enqueued_at=_when(item.enqueued_ms),
            priority=item.priority,
            content_type=item.content_type,
            payload_bytes=len(item.payload),
        )
    return doc


@dead_letters.command("list")
@_store_option
@click.option("--app", default=None, help="Only this app's dead letters.")
@click.option("--tenant", default=None, help="Only this tenant's (in every app, or in --app).")
@click.option("--json", "as_json", is_flag=True, help="One JSON document (a list).")
@_friendly
def dead_letters_list(store: str, app: str | None, tenant: str | None, as_json: bool) -> None:
    """Dead letters: zone, id, job type, attempts, errors, when, reason, traceback."""
    from quickzones.store.admin import list_dead_letters

    app, tenant = _filters(app, tenant)
    q = _open(store, create=False)
    try:
        letters = list_dead_letters(q, app, tenant)
    finally:
        q.close()
    docs = [_letter_doc(d) for d in letters]
    if as_json:
        click.echo(json.dumps(docs, ensure_ascii=False))
        return
    columns = ["app", "tenant", "item id", "job type", "attempts", "errors", "dead at (UTC)",
               "reason"]  # fmt: skip
    rows = [
        [
            d["app"],
            d["tenant"],
            d["item_id"],
            d["job_type"] or "(corrupt)",
            "" if d["attempts"] is None else str(d["attempts"]),
            "" if d["error_count"] is None else str(d["error_count"]),
            d["dead_at"],
            d["reason"],
        ]
        for d in docs
    ]
    console = _console()
    console.print(_table(f"dead letters ({len(docs)})", columns, rows))
    for d in docs:
        if d["traceback"]:
            console.rule(f"traceback of {d['app']}/{d['tenant']} {d['item_id']}")
            console.print(d["traceback"].rstrip("\n"), markup=False, highlight=False)


@dead_letters.command("requeue")
@_store_option
@click.option("--app", required=True)
@click.option("--tenant", required=True)
@click.option("--id", "item_id", default=None, help="One item; default every dead letter.")
@_friendly
def dead_letters_requeue(store: str, app: str, tenant: str, item_id: str | None) -> None:
    """Put dead letters back into their zone. A dead letter whose id is already queued in
    the zone is kept and reported (exit status 2)."""
    from quickzones.errors import ItemAlreadyQueued
    from quickzones.store.admin import list_dead_letters, requeue_dead_letter

    q = _open(store)
    try:
        zone = q.zone(app, tenant)
        if item_id:
            requeue_dead_letter(q, zone, item_id)
            click.echo("requeued 1")
            return
        kept: list[str] = []
        done = 0
        for d in list_dead_letters(q, zone.app, zone.tenant):
            if d.item is None:
                continue  # corrupt: only purge can remove it
            try:
                requeue_dead_letter(q, zone, d.item_id)
                done += 1
            except ItemAlreadyQueued:
                kept.append(d.item_id)
        click.echo(f"requeued {done}")
        if kept:
            _error_line(
                QuickError(
                    f"{len(kept)} dead letter(s) kept, their ids are already queued in "
                    f"{zone}: {', '.join(kept)}"
                )
            )
            sys.exit(2)
    finally:
        q.close()


@dead_letters.command("purge")
@_store_option
@click.option("--app", default=None, help="Only this app's dead letters.")
@click.option("--tenant", default=None, help="Only this tenant's (in every app, or in --app).")
@_friendly
def dead_letters_purge(store: str, app: str | None, tenant: str | None) -> None:
    """Delete exactly the dead letters ``list`` shows with the same filters."""
    from quickzones.store.admin import purge_dead_letters

    app, tenant = _filters(app, tenant)
    q = _open(store)
    try:
        click.echo(f"purged {purge_dead_letters(q, app, tenant)}")
    finally:
        q.close()


@main.command()
@click.option(
    "--store",
    default=None,
    help="Store URL (default: the group's --store, else a fresh SQLite file; never "
    "$QUICK_STORE, so the demo does not load a real store by accident).",
)
@click.option("--tenants", type=int, default=20, show_default=True, help="Small tenants.")
@click.option("--noisy-factor", type=int, default=100, show_default=True)
@click.option(
    "--rate", type=float, default=5.0, show_default=True, help="Items/s per small tenant."
)
@click.option("--duration", type=float, default=None, help="Seconds of load.  [default: 20.0]")
@click.option("--seconds", type=float, default=None, help="The same as --duration.")
@click.option("--work-ms", type=float, default=2.0, show_default=True, help="Work per item.")
@click.option("--workers", type=int, default=8, show_default=True)
@click.option("--seed", type=int, default=1, show_default=True)
@_friendly
def demo(
    store: str | None,
    tenants: int,
    noisy_factor: int,
    rate: float,
    duration: float | None,
    seconds: float | None,
    work_ms: float,
    workers: int,
    seed: int,
) -> None:
    """Many tenants, one noisy one: watch the small ones stay fast."""
    from quickzones.cli.demo import DemoConfig, run_demo

    if duration is not None and seconds is not None:
        raise click.UsageError("give --seconds or --duration (the same option), not both")
    if store is None:
        store = (click.get_current_context().find_root().obj or {}).get("typed_store")

    ok = run_demo(
        DemoConfig(
            store=store,
            tenants=tenants,
            noisy_factor=noisy_factor,
            rate=rate,
            duration_s=next((d for d in (duration, seconds) if d is not None), 20.0),
            work_ms=work_ms,
            workers=workers,
            seed=seed,
        )
    )
    sys.exit(0 if ok else 1)


# --- Tenant moves ---------------------------------------------------------------------


@main.command("move-tenant")
@click.option("--from", "source", required=True, help="Source KV store URL.")
@click.option("--to", "target", required=True, help="Target KV store URL.")
@click.option("--app", required=True)
@click.option("--tenant", required=True)
@click.option("--include-leased", is_flag=True, help="Take over running items' leases.")
@click.option("--lease-wait", type=float, default=60.0, show_default=True)
@_friendly
def move_tenant_cmd(
    source: str, target: str, app: str, tenant: str, include_leased: bool, lease_wait: float
) -> None:
    """Move one tenant's zone between KV stores: zone, then pointer, then remove source."""
    from quickzones.errors import ConfigurationError
    from quickzones.store.tenant_move import move_tenant

    if source == target:
        raise ConfigurationError("--from and --to name the same store")
    src, dst = _open(source), _open(target)
    try:
        report = move_tenant(
            src, dst, app, tenant, include_leased=include_leased, lease_wait_s=lease_wait
        )
    finally:
        src.close()
        dst.close()
    click.echo(
        f"{app}/{tenant}: moved {report.moved} (total {report.moved_total}), "
        f"source {report.source_before} -> {report.source_after}, "
        f"leased left {report.skipped_leased}"
    )
    for note in report.notes:
        click.echo(f"note: {note}", err=True)
    sys.exit(0 if report.ok else 1)


if __name__ == "__main__":
    main()


from quickzones.cli.reshard import reshard as _reshard  # noqa: E402  (it imports this module)

main.add_command(_reshard)
