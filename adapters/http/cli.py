"""``quick serve`` and ``quick tokens create|list|revoke``.

Registered in the ``quickzones.cli`` entry point group (``pyproject.toml``), so the core's
``quick`` imports this module only when one of these commands runs or ``quick --help``
lists them; FastAPI only when ``quick serve`` runs.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

import click

from quickzones.adapters.http import require_web_framework
from quickzones.adapters.http.connections import ACCEPT_BACKLOG, Budget, guarded
from quickzones.adapters.http.tokens import ROLES, TokenStore
from quickzones.cli import friendly, store_option
from quickzones.cli.options import echo_next_cursor, page_options, read_listing
from quickzones.client import Quick
from quickzones.errors import ConfigurationError


def _tokens(q: Quick) -> TokenStore:
    return TokenStore(q.kv, q.keys, q.clock)


@click.command("serve")
@store_option
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address to bind; anything but loopback exposes the store to the network.",
)
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True)
@click.option(
    "--max-body",
    "max_body",
    type=click.IntRange(min=1024),
    default=4 * 1024 * 1024,
    show_default=True,
    help="Largest request body in bytes (413 beyond).",
)
@click.option("--no-dashboard", "no_dashboard", is_flag=True, help="Serve the API only.")
@click.option(
    "--log-level",
    default="info",
    show_default=True,
    type=click.Choice(["critical", "error", "warning", "info", "debug"]),
)
@friendly
def serve_cmd(
    store: str,
    host: str,
    port: int,
    max_body: int,
    no_dashboard: bool,
    log_level: str,
) -> None:
    """Serve the HTTP API (/v1, OpenAPI at /docs) and the dashboard (/) over a store.

    The connections and long polls it holds follow the open-file limit (ulimit -n).
    """
    require_web_framework()  # the serve extra's clear error, before its imports
    import uvicorn

    from quickzones.adapters.http.app import create_app
    from quickzones.consumer.config import ConsumerConfig

    q = Quick.open(store, create=False)
    try:
        if not _tokens(q).page(limit=1).rows:
            click.echo(
                "warning: no tokens yet; create one with: quick tokens create --app APP "
                "--role produce --role consume --role admin",
                err=True,
            )
        if host not in ("127.0.0.1", "::1", "localhost"):
            click.echo(
                f"warning: binding {host}: the API is reachable from the network; put TLS "
                "in front of it (tokens travel in every request)",
                err=True,
            )
        app = create_app(
            q,
            max_body=max_body,
            dashboard=not no_dashboard,
            config=ConsumerConfig(),
        )
        from uvicorn.protocols.http.auto import AutoHTTPProtocol

        budget = Budget.of()  # as create_app's: this process's open-file limit
        click.echo(
            f"quick serve: at most {budget.connections} connections, {budget.long_polls} "
            f"long polls ({budget.long_polls_per_token} of one token), from the open-file "
            "limit (ulimit -n)",
            err=True,
        )
        # Bodies over --max-body are cut at the connection too (BodyLimit answers 413 to
        # those it sees); connections of tokens the server admitted are closed last.
        http = guarded(
            AutoHTTPProtocol,
            budget.connections,
            max_body=max_body,
            admitted=app.state.quick.tokens.admitted,
        )
        uvicorn.run(
            app,
            host=host,
            port=port,
            log_level=log_level,
            server_header=False,
            http=http,
            backlog=ACCEPT_BACKLOG,
        )
    finally:
        q.close()


@click.group("tokens")
def tokens_group() -> None:
    """Bearer tokens for quick serve: one app, some roles, stored hashed."""


@tokens_group.command("create")
@store_option
@click.option("--app", default=None, help="The app the token may act on.")
@click.option(
    "--all-apps",
    "all_apps",
    is_flag=True,
    help="Act on every app (an operator's token; needed for /v1/shards).",
)
@click.option(
    "--role",
    "roles",
    multiple=True,
    required=True,
    type=click.Choice(ROLES),
    help="produce, consume or admin; repeat for several.",
)
@click.option("--label", default="", help="A note: who or what holds it.")
@click.option("--json", "as_json", is_flag=True)
@friendly
def create_cmd(
    store: str, app: str | None, all_apps: bool, roles: tuple[str, ...], label: str, as_json: bool
) -> None:
    """Create a token; it is printed once and only its hash is stored."""
    if all_apps == (app is not None):
        raise ConfigurationError("give exactly one of --app APP or --all-apps")
    q = Quick.open(store)
    try:
        tokens = _tokens(q)
        if all_apps:
            token, info = tokens.create_for_all_apps(list(roles), label=label)
        else:
            token, info = tokens.create(str(app), list(roles), label=label)
    finally:
        q.close()
    if as_json:
        click.echo(
            json.dumps(
                {
                    "token": token,
                    "token_id": info.token_id,
                    "app": info.app,
                    "all_apps": info.all_apps,
                    "roles": list(info.roles),
                }
            )
        )
    else:
        click.echo(token)
        click.echo(
            f"id {info.token_id}, app {info.app}, roles {','.join(info.roles)} "
            "(keep the token: it cannot be shown again)",
            err=True,
        )


@tokens_group.command("list")
@store_option
@page_options("tokens")
@click.option("--json", "as_json", is_flag=True)
@friendly
def list_cmd(store: str, limit: int | None, cursor: str | None, as_json: bool) -> None:
    """The tokens by id (ids, apps, roles; never the secrets)."""
    q = Quick.open(store, create=False)
    try:
        infos, next_cursor = read_listing(_tokens(q).page, limit, cursor)
    finally:
        q.close()
    echo_next_cursor(next_cursor)
    if as_json:
        click.echo(
            json.dumps(
                [
                    {
                        "token_id": t.token_id,
                        "app": t.app,
                        "all_apps": t.all_apps,
                        "roles": list(t.roles),
                        "label": t.label,
                        "created_ms": t.created_ms,
                    }
                    for t in infos
                ]
            )
        )
        return
    for t in infos:
        created = datetime.fromtimestamp(t.created_ms / 1000, tz=UTC).isoformat(timespec="seconds")
        click.echo(
            f"{t.token_id}  app={t.app}  roles={','.join(t.roles)}  created={created}"
            f"  {t.label}".rstrip()
        )


@tokens_group.command("revoke")
@store_option
@click.argument("token_id")
@friendly
def revoke_cmd(store: str, token_id: str) -> None:
    """Revoke a token by id; requests with it get 401 from then on."""
    q = Quick.open(store, create=False)
    try:
        _tokens(q).revoke(token_id)
    finally:
        q.close()
    click.echo(f"revoked {token_id}")
