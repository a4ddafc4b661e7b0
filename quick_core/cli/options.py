"""What the built-in commands share: ``--store`` and its default, the one-line errors with
exit status 2, and opening the store a command works on.

An implementation's own command group uses ``store_option`` and ``friendly`` too (see
:mod:`quickzones.cli.plugins`)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar

import click

from quickzones.errors import QuickError

F = TypeVar("F", bound=Callable[..., Any])

DEFAULT_STORE = "sqlite:///quick.db"


STORE_HELP = (
    f"Store URL: sqlite:///path, postgresql://..., memory://, fdb:// [env QUICK_STORE;"
    f" default {DEFAULT_STORE}]"
)


def store_option(fn: F) -> F:
    """``--store`` on a subcommand; without it the group's ``--store`` (given before the
    subcommand, or ``$QUICK_STORE``) applies, then the default."""

    @wraps(fn)
    def resolve(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("store") is None:
            root = click.get_current_context().find_root()
            kwargs["store"] = (root.obj or {}).get("store") or DEFAULT_STORE
        return fn(*args, **kwargs)

    return click.option("--store", default=None, help=STORE_HELP)(resolve)  # type: ignore[return-value]


def check_arguments() -> None:
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


def error_line(err: BaseException) -> None:
    # One line even if the message has a newline in it, and printable on any terminal.
    text = " ".join(str(err).split("\n"))
    encoding = getattr(sys.stderr, "encoding", None) or "utf-8"
    click.echo(f"error: {text}".encode(encoding, "backslashreplace").decode(encoding), err=True)


def friendly(fn: F) -> F:
    """Every quick error becomes one clear line on stderr and exit status 2."""

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            check_arguments()
            return fn(*args, **kwargs)
        except QuickError as err:
            error_line(err)
            sys.exit(2)

    return wrapper  # type: ignore[return-value]


def open_store(store: str, *, create: bool = True, **options: Any) -> Any:
    """The store a command works on; commands that only read pass ``create=False`` so a
    typo or another application's file is refused, never created or converted."""
    from quickzones.client import Quick

    return Quick.open(store, create=create, **options)
