"""The application module a command runs or reads (``--app-module module[:attr]``)."""

from __future__ import annotations

import importlib
from typing import Any

from quickzones.errors import HandlerImportError


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
