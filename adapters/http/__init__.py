"""``quick serve``: an HTTP API for remote producers and pull consumers, with a dashboard.

Needs the ``serve`` extra (``pip install 'quickzones[serve]'``). The app factory is
:func:`create_app`; tokens are :class:`TokenStore`'s; the Python client is
:mod:`quickzones.adapters.http.client`.
"""

from __future__ import annotations

from quickzones.errors import MissingDependency

try:
    import fastapi  # noqa: F401
    import pydantic  # noqa: F401
except ImportError as err:  # pragma: no cover - depends on the install
    raise MissingDependency(err.name or "fastapi", "serve", "quick serve needs it") from err

from quickzones.adapters.http.app import create_app
from quickzones.adapters.http.tokens import ROLES, TokenInfo, TokenNotFound, TokenStore
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
