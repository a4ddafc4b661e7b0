"""A document the code cites is in the repository, under the path the code names (issue 27
point 3): every ``*.md`` a docstring or comment of ``quick_core/``, ``backends/``,
``adapters/`` or ``integration/`` names is a repository path that exists, so a reader can
open it; no reference to a design note that only lived beside the checkout."""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("quick_core", "backends", "adapters", "integration")
MD_PATH = re.compile(r"(?<![\w./-])([\w./-]*\w\.md)\b")


def _cited(path: Path) -> list[tuple[int, str]]:
    """(line, name) of every ``*.md`` named in the file's comments and strings (docstrings
    are strings)."""
    found: list[tuple[int, str]] = []
    tokens = tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
    for tok in tokens:
        if tok.type in (tokenize.COMMENT, tokenize.STRING):
            for match in MD_PATH.finditer(tok.string):
                line = tok.start[0] + tok.string[: match.start()].count("\n")
                found.append((line, match.group(1)))
    return found


def test_every_cited_document_is_a_repository_path_that_exists() -> None:
    missing: list[str] = []
    cited = 0
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for line, name in _cited(path):
                cited += 1
                if not (ROOT / name).is_file():
                    missing.append(f"{path.relative_to(ROOT)}:{line}: {name}")
    assert cited >= 10, cited
    assert missing == [], f"{len(missing)} cited documents not in the repository: {missing}"


def test_the_design_documents_are_published() -> None:
    nav = (ROOT / "mkdocs.yml").read_text()
    for page in ("design.md", "fdb-semantics.md"):
        assert (ROOT / "docs" / page).is_file(), page
        assert page in nav, f"{page} is not in mkdocs.yml's nav"
        # The repository paths they name, in this repo's layout.
        text = (ROOT / "docs" / page).read_text()
        named = re.findall(r"`((?:quick_core|backends|adapters)/[\w/.]*)`", text)
        assert named, page
        assert [n for n in named if not (ROOT / n).exists()] == [], page
