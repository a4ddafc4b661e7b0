"""``quick serve``: an HTTP API for remote producers and pull consumers, with a dashboard.

Needs the ``serve`` extra (``pip install 'quickzones[serve]'``). The app factory is
:func:`create_app`; tokens are :class:`TokenStore`'s; the Python client is
:mod:`quickzones.adapters.http.client`.

Importing this package loads no web framework: ``quick --help`` lists ``serve`` and
``tokens`` through their module (``cli``), and a remote worker needs only the client, so
FastAPI (a third of a second to import) loads with the app (:func:`create_app`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from quickzones.adapters.http.tokens import ROLES, TokenInfo, TokenNotFound, TokenStore
from quickzones.errors import MissingDependency

if TYPE_CHECKING:
    from quickzones.adapters.http.app import create_app
    from quickzones.consumer.pull_leaser import PullConfig, PullLeaser

__all__ = [
    "ROLES",
    "PullConfig",
    "PullLeaser",
    "TokenInfo",
    "TokenNotFound",
    "TokenStore",
    "create_app",
]


def require_web_framework() -> None:
    """Raise :class:`MissingDependency`, naming the ``serve`` extra, when FastAPI or
    pydantic is not installed (the app's modules call it before importing them)."""
    try:
        import fastapi  # noqa: F401
        import pydantic  # noqa: F401
    except ImportError as err:  # pragma: no cover - depends on the install
        raise MissingDependency(err.name or "fastapi", "serve", "quick serve needs it") from err


def __getattr__(name: str) -> Any:
    # PEP 562: the app, and the web framework with it, load on first use.
    if name == "create_app":
        require_web_framework()
        from quickzones.adapters.http.app import create_app

        return create_app
    if name in ("PullConfig", "PullLeaser"):
        from quickzones.consumer import pull_leaser

        return getattr(pull_leaser, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
