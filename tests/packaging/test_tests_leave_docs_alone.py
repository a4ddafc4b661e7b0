"""Running the suite leaves the tracked tree as it found it: the dashboard's browser tests
took their screenshots straight into ``docs/img/``, so every run of ``scripts/test`` left
the docs' pictures modified (seen after a run of test_dashboard_fairness.py). Every
screenshot a test takes now goes through ``tests/serve/browser.py``'s
:func:`screenshot_path`, which writes into ``docs/img/`` only when asked."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.serve.browser import ARTIFACTS, DOCS_IMG, screenshot_path

REPO = Path(__file__).resolve().parents[2]
_SCREENSHOT = re.compile(r"\.screenshot\(\s*path\s*=\s*(?P<arg>[^,)]*)")


def test_every_screenshot_goes_through_screenshot_path() -> None:
    offenders = []
    for folder in ("tests", "integration"):
        for path in sorted((REPO / folder).rglob("*.py")):
            text = path.read_text(encoding="utf-8")
            for found in _SCREENSHOT.finditer(text):
                arg = found.group("arg")
                if "screenshot_path(" not in arg:
                    offenders.append(f"{path.relative_to(REPO)}: {found.group(0)}")
            if path.name != "browser.py" and re.search(r"[\"']docs[\"']\s*/\s*[\"']img", text):
                offenders.append(f"{path.relative_to(REPO)}: builds a path into docs/img")
    assert offenders == []


def test_screenshots_go_to_the_docs_only_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("QUICK_UPDATE_SCREENSHOTS", raising=False)
    assert screenshot_path("x.png") == ARTIFACTS / "x.png"
    monkeypatch.setenv("QUICK_UPDATE_SCREENSHOTS", "1")
    assert screenshot_path("x.png") == DOCS_IMG / "x.png"
    assert not (DOCS_IMG / "x.png").exists()  # only the path: nothing written
