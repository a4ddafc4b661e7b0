"""``quick worker``: a consumer (Algorithms 1 to 3) running an app module's handlers."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

import click

from quickzones.cli.app_module import load_handlers
from quickzones.cli.group import main
from quickzones.cli.options import F, cpus_option, friendly
from quickzones.consumer.config import ConsumerConfig

_DEFAULTS = ConsumerConfig()


def _config_option(flag: str, field: str, kind: Any, help: str) -> Callable[[F], F]:
    """A ``quick worker`` option for the ConsumerConfig field ``field``, whose default
    (shown in ``--help``) is the field's."""
    return click.option(
        flag, field, type=kind, default=getattr(_DEFAULTS, field), show_default=True, help=help
    )


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
@click.option("--managers", type=click.IntRange(min=1), default=_DEFAULTS.managers,
              show_default=True, help="Zone visits at once.")  # fmt: skip
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
@click.option("--processes", type=click.IntRange(min=1), default=1, show_default=True,
              help="Consumer processes, kept running by a supervisor.")  # fmt: skip
@click.option("--metrics-port", type=click.IntRange(0, 65535), default=None,
              help="Serve Prometheus metrics on this port.")  # fmt: skip
@click.option("--metrics-address", default="127.0.0.1", show_default=True,
              help="Address the metrics server listens on.")  # fmt: skip
@click.option("--election", default=None,
              help="redis:// or memcached:// URL gating the in-order scanner lease.")  # fmt: skip
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
    "Seconds before an item of a type this worker cannot run is reported (never settled).",
)
@cpus_option
@friendly
def worker(
    app_module: str,
    workers: int,
    managers: int,
    lease_s: float,
    shutdown_deadline_s: float,
    dequeue_max: int,
    processes: int,
    metrics_port: int | None,
    metrics_address: str,
    election: str | None,
    remote: str | None,
    token: str | None,
    apps: str | None,
    job_types: str | None,
    unhandled_grace_s: float,
    cpus: str | set[int],
) -> None:
    """Run a consumer until SIGTERM/SIGINT.

    Every other ConsumerConfig field is set from Python:
    quick.consumer(ConsumerConfig(...)).run_forever() (docs/configuration.md).
    """
    from quickzones.cpu_placement import placement_from_env
    from quickzones.errors import ConfigurationError
    from quickzones.urls import open_election

    routed_apps = _name_list("--apps", apps)
    routed_types = _name_list("--types", job_types)
    if unhandled_grace_s < 0:
        raise ConfigurationError(f"--unhandled-grace must be at least 0, not {unhandled_grace_s}")
    if processes == 1:  # a child of --processes stops when its supervisor is gone
        from quickzones.supervisor import follow_supervisor

        follow_supervisor()
    sys.path.insert(0, os.getcwd())
    q = load_handlers(app_module)  # in a supervisor too: a bad module fails before any child
    if not q.registry.names():
        # It would only lease other workers' items and give them back (issue 41 point 3).
        raise ConfigurationError(
            f"--app-module {app_module}: its Quick registers no job type, so this worker "
            "would have nothing to run; register a handler where the module creates its "
            'Quick (@quick.job("name") above def handler(payload, ctx): ...), or give '
            "the module that does (--app-module module:attr)"
        )
    # This process's threads on one CPU while they only take turns at the GIL (a
    # --processes child on its own one): quickzones.cpu_placement. Checked here, in a
    # supervisor too.
    placement = placement_from_env(cpus)
    if processes > 1:
        child_args = [
            "--workers", str(workers), "--managers", str(managers), "--lease", repr(lease_s),
            "--shutdown-deadline", repr(shutdown_deadline_s), "--dequeue-max", str(dequeue_max),
            "--unhandled-grace", repr(unhandled_grace_s), "--cpus", _cpus_arg(cpus),
        ]  # fmt: skip
        for flag, value in (("--election", election), ("--remote", remote), ("--apps", apps),
                            ("--types", job_types)):  # fmt: skip
            if value is not None:
                child_args += [flag, value]
        _supervise(q, app_module, child_args, processes, token, metrics_port, metrics_address)
        return
    if remote is not None:  # the handlers run here; the store is behind quick serve
        from urllib.parse import urlsplit

        from quickzones import schemes

        run_remote = schemes.factory(schemes.REMOTE_WORKERS, urlsplit(remote).scheme, remote)
        q.store_type_policies()  # for producers without the handlers, as a consumer's start
        placement.start()
        try:
            run_remote(q, remote, token, workers=workers, lease_s=lease_s)
        finally:
            placement.stop()
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
    from quickzones.consumer.metrics import shared_observer

    # A child of --processes: its supervisor serves the metrics (SHARED_ENV in metrics.py).
    observer = shared_observer()
    if observer is None and metrics_port is not None:
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
        f"visit_max {config.visit_max or 'the free capacity'}, "
        f"{'one transaction' if config.one_transaction_visits else 'three transactions'} "
        f"per visit{_batched(config.visits_per_transaction)}, "
        f"timer lookahead {config.timer_lookahead_s:g}s, "
        f"commit poll {_seconds_or_off(config.commit_poll_s)}, "
        f"completion flush {_seconds_or_off(config.completion_flush_s or None)}, "
        f"shutdown deadline {config.shutdown_deadline_s}s, "
        f"unhandled grace {config.unhandled_grace_s:g}s; "
        f"cluster {q.toplevel.cluster!r}"
    )
    placement.start()  # given back in the finally: run in-process (tests), as found
    if scheduler is not None:
        scheduler.start()
    try:
        consumer.run_forever()
    finally:
        placement.stop()
        if scheduler is not None:
            scheduler.stop()


def _cpus_arg(cpus: str | set[int]) -> str:
    return cpus if isinstance(cpus, str) else ",".join(str(c) for c in sorted(cpus))


def _supervise(
    q: Any,
    app_module: str,
    child_args: list[str],
    processes: int,
    token: str | None,
    metrics_port: int | None,
    metrics_address: str,
) -> None:
    """``--processes N``: N ``quick worker`` children with the same options under a
    :class:`~quickzones.supervisor.Supervisor`, and one metrics endpoint for them all."""
    from quickzones.errors import ConfigurationError
    from quickzones.supervisor import Supervisor, worker_command

    env = dict(os.environ)
    if token is not None:
        env["QUICK_TOKEN"] = token  # not on the children's command lines (ps shows those)
    shared = None
    if metrics_port is not None:
        from quickzones.consumer.metrics import SharedMetrics

        try:
            shared = SharedMetrics(q, metrics_port, metrics_address)
        except OSError as err:
            raise ConfigurationError(
                f"cannot serve metrics on {metrics_address}:{metrics_port}: {err.strerror or err}"
            ) from err
        env.update(shared.env)  # the children count into its folder; it serves them
    verbose = click.get_current_context().find_root().params.get("verbose") or 0
    supervisor = Supervisor(
        worker_command(app_module, child_args, verbose=verbose),
        processes,
        env=env,
        on_exit=shared.process_gone if shared is not None else (lambda pid: None),
        say=lambda line: click.echo(f"quick worker: {line}", err=True),
    )
    try:
        code = supervisor.run()
    finally:
        if shared is not None:
            shared.close()
    if code:
        sys.exit(code)
