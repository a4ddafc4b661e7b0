"""``bench/results/`` is an index of the runs the documentation cites, not a scratch folder
(issue 27 point 4): every ``bench/results/...`` path that ``docs/``, ``README.md`` or
``bench/`` cites exists, every run they cite has an entry in ``bench/results/README.md``,
and no probe script, patch or log is tracked there (history keeps those)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"
INDEX = RESULTS / "README.md"
FORBIDDEN = (".py", ".pyc", ".patch", ".log", ".sh", ".diff")

# A cited path runs to the first character that cannot be in one (a backtick, a space,
# a closing parenthesis...); a fragment names an index entry.
CITED = re.compile(r"bench/results/[\w./*-]*(?:#[\w-]+)?")
RUN = re.compile(r"\b2026\d{4}T\d{4,6}Z(?:-[\w-]+)?", re.IGNORECASE)


def _pages() -> list[Path]:
    """The docs, and the benchmarks' own pages and docstrings (outside the runs)."""
    bench = [
        p
        for p in sorted((ROOT / "bench").rglob("*"))
        if p.suffix in (".md", ".py") and RESULTS not in p.parents
    ]
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *bench]


def _anchors() -> set[str]:
    """GitHub's anchors of the index's headings (lower case, spaces to dashes)."""
    headings = re.findall(r"^#+ (.+)$", INDEX.read_text(), flags=re.MULTILINE)
    return {re.sub(r"[^\w -]", "", h).strip().lower().replace(" ", "-") for h in headings}


def _kept() -> set[str]:
    """The paths under ``bench/results`` a clean clone has: what git tracks, folders
    included (a run's ignored folder on this disk would pass here and fail in CI, as one
    did at stop 57); outside a git checkout, what is on disk."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        return {str(p.relative_to(ROOT)) for p in RESULTS.rglob("*")}
    files = subprocess.run(
        ["git", "ls-files", "-z", "bench/results"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\0")
    kept: set[str] = set()
    for name in filter(None, files):
        parts = name.split("/")
        kept.update("/".join(parts[:i]) for i in range(1, len(parts) + 1))
    return kept


def test_every_cited_results_path_exists() -> None:
    anchors = _anchors()
    kept = _kept()
    missing: list[str] = []
    for page in _pages():
        text = page.read_text()
        for cited in CITED.findall(text):
            path, _, fragment = cited.rstrip(".").partition("#")
            if "*" in path or path.rstrip("/") not in kept:
                missing.append(f"{page.relative_to(ROOT)}: {cited} (no such path)")
            elif fragment and fragment not in anchors:
                missing.append(f"{page.relative_to(ROOT)}: {cited} (no such index entry)")
        # A run named by its folder, alone or as a fragment after the index's path.
        for run in RUN.findall(text):
            if run.lower() not in anchors:
                missing.append(f"{page.relative_to(ROOT)}: {run} (no entry in the index)")
    assert missing == []


def _entries() -> dict[str, str]:
    """Each run's entry in the index: its anchor and the text under its heading."""
    parts = re.split(r"^### (.+)$", INDEX.read_text(), flags=re.MULTILINE)
    return {parts[i].strip().lower(): parts[i + 1] for i in range(1, len(parts) - 1, 2)}


def test_every_entry_of_the_index_is_a_kept_run_or_holds_its_figures() -> None:
    """An entry either keeps its run's summary folder, or (new runs) holds the figures and
    the command themselves, with no folder: the index, not the scratch."""
    runs = [a for a in _anchors() if RUN.fullmatch(a)]
    folders = {p.split("/")[2].lower() for p in _kept() if p.count("/") >= 3}
    assert len(runs) >= 20, runs
    entries = _entries()
    bare = [
        run
        for run in sorted(set(runs) - folders)
        if "python -m bench." not in entries.get(run, "") or "|" not in entries.get(run, "")
    ]
    assert bare == [], f"entries with neither a kept run nor their figures and command: {bare}"


def test_no_script_patch_or_log_is_tracked_under_bench_results() -> None:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    tracked = subprocess.run(
        ["git", "ls-files", "bench/results"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert tracked, "bench/results/README.md is not tracked"
    bad = [p for p in tracked if p.endswith(FORBIDDEN) or "__pycache__" in p]
    assert bad == [], f"{len(bad)} scripts, patches or logs tracked: {bad[:10]}"
