"""What the built-in commands share: ``--store`` and its default, the one-line errors with
exit status 2, and opening the store a command works on.

An implementation's own command group uses ``store_option`` and ``friendly`` too (see
:mod:`quickzones.cli.plugins`)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from functools import wraps
from typing import TYPE_CHECKING, Any, TypeVar

import click

from quickzones.errors import QuickError

if TYPE_CHECKING:
    from quickzones.store.pages import Page

F = TypeVar("F", bound=Callable[..., Any])
R = TypeVar("R")

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


def page_options(what: str) -> Callable[[F], F]:
    """``--limit`` and ``--cursor`` on a listing command of ``what`` (a paged list):
    with either, one page read from the store, and its next cursor on stderr
    (:func:`echo_next_cursor`); with neither, the whole list, a page at a time."""

    def add(fn: F) -> F:
        fn = click.option(
            "--cursor", default=None, help="Start where the page before ended (its cursor)."
        )(fn)
        return click.option(
            "--limit",
            type=click.IntRange(min=1),
            default=None,
            help=f"One page of at most this many {what} (read from the store a page at a "
            "time, however many lie behind it); the cursor of the next page is printed "
            "after it.",
        )(fn)

    return add


def echo_next_cursor(next_cursor: str | None) -> None:
    """A page's next cursor, on stderr so stdout stays the table or the JSON list the
    docs describe; nothing after the last page."""
    if next_cursor is not None:
        click.echo(f"next cursor: {next_cursor}", err=True)


def read_listing(
    page: Callable[..., Page[R]], limit: int | None, cursor: str | None
) -> tuple[list[R], str | None]:
    """What a listing command shows: with ``--limit`` or ``--cursor`` one page (50 rows
    unless limited) and its next cursor; with neither every page, followed here."""
    if limit is not None or cursor is not None:
        one = page(limit=limit or 50, cursor=cursor)
        return one.rows, one.next_cursor
    rows: list[R] = []
    while True:
        got = page(limit=1000, cursor=cursor)
        rows += got.rows
        if got.next_cursor is None:
            return rows, None
        cursor = got.next_cursor


CPUS_HELP = "auto (one CPU while GIL-bound), all, or a list: 0,2-3."


def cpus_option(fn: F) -> F:
    """``--cpus`` (:mod:`quickzones.cpu_placement`): the value is given to the command
    parsed, ``auto``, ``all`` or a set of CPU numbers; a bad one is a one-line error."""

    def parse(ctx: click.Context, param: click.Parameter, value: str) -> str | set[int]:
        from quickzones.cpu_placement import parse_cpus

        try:
            return parse_cpus(value)
        except QuickError as err:
            raise click.BadParameter(str(err)) from None

    return click.option(
        "--cpus", "cpus", envvar="QUICK_CPUS", default="auto", show_default=True,
        callback=parse, help=CPUS_HELP,
    )(fn)  # fmt: skip
