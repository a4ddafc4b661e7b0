"""The one error every provisioning helper raises when it cannot get its service."""

from __future__ import annotations

import os


class ServiceUnavailable(RuntimeError):
    """No way to get the service worked; ``reason`` says what was tried.

    Raised before anything was started (a missing binary, no Docker engine, no address in
    the environment), so a caller may skip a test on it; a server that was found but then
    failed to start raises ``RuntimeError`` with its log instead, which is a real error.
    """

    def __init__(self, service: str, reason: str) -> None:
        super().__init__(f"{service} unavailable: {reason}")
        self.service = service
        self.reason = reason


def in_ci() -> bool:
    """True when ``CI`` says this is a CI run: there a missing service fails a suite
    instead of skipping it, so a misconfigured job cannot go green by skipping."""
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")
