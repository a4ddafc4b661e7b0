"""Headless Chromium for the dashboard's browser tests: Debian's ``chromium`` driven by
Playwright's pip package, never a downloaded browser. A browser test module calls
:func:`require_chromium` at import and takes the ``browser`` fixture (tests/serve/conftest.py)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
_REPO = Path(__file__).resolve().parents[2]
DOCS_IMG = _REPO / "docs" / "img"
ARTIFACTS = _REPO / "build" / "artifacts" / "serve"


def screenshot_path(name: str) -> Path:
    """Where a browser test saves the screenshot ``name`` (``serve-fairness.png``):
    ``docs/img/`` only when ``QUICK_UPDATE_SCREENSHOTS=1`` asks for the docs' pictures to
    be made again, else ``build/artifacts/serve/`` (ignored), so running the suite leaves
    the tracked tree as it found it."""
    folder = DOCS_IMG if os.environ.get("QUICK_UPDATE_SCREENSHOTS") == "1" else ARTIFACTS
    folder.mkdir(parents=True, exist_ok=True)
    return folder / name


def require_chromium() -> None:
    """Fail the module where chromium must be (CI, QUICK_REQUIRE_BROWSER), else skip it."""
    if CHROMIUM is not None:
        return
    if os.environ.get("CI") or os.environ.get("QUICK_REQUIRE_BROWSER"):
        pytest.fail("chromium is not installed (scripts/test installs it)", pytrace=False)
    pytest.skip("chromium is not installed (apt-get install chromium)", allow_module_level=True)


def launched_chromium() -> Iterator[Any]:
    """A headless Chromium, closed after use."""
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as pw:
        launched = pw.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=["--no-sandbox", "--disable-gpu"]
        )
        try:
            yield launched
        finally:
            launched.close()
