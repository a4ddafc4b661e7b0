"""``--json`` prints what docs/operations.md says, shape and fields (issue 28 point 18):
the page names, per command, "a list of objects" or "one object" and its fields; the test
runs each command and compares."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from quickzones.cli import main
from quickzones.client import Quick
from quickzones.errors import PermanentError
from quickzones.registry import JobContext

DOC = Path(__file__).resolve().parents[2] / "docs" / "operations.md"
SENTENCE = re.compile(
    r"`(?P<cmd>[a-z][a-z -]*?) --json` prints (?P<shape>a list of objects|one object) with "
    r"(?P<fields>(?:`\w+`(?: \([^)]*\))?(?:,? and |, )?)+)"
)


def _documented() -> dict[str, tuple[str, set[str]]]:
    text = " ".join(DOC.read_text().split())
    return {
        m["cmd"]: (m["shape"], set(re.findall(r"`(\w+)`", re.sub(r"\([^)]*\)", "", m["fields"]))))
        for m in SENTENCE.finditer(text)
    }


@pytest.fixture
def store(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'json.db'}"
    q = Quick.open(url)
    try:

        @q.job("doomed")
        def doomed(payload: object, ctx: JobContext) -> None:
            raise PermanentError("no")

        q.enqueue("doomed", {}, app="a", tenant="t")
        q.run_until_idle()
        q.enqueue("later", {}, app="a", tenant="t", delay=600)
    finally:
        q.close()
    return url


@pytest.mark.parametrize("command", ["stats", "zones", "dead-letters list"])
def test_json_output_is_what_the_docs_say(store: str, command: str) -> None:
    documented = _documented()
    assert command in documented, f"docs/operations.md does not say what `{command} --json` is"
    shape, fields = documented[command]
    result = CliRunner().invoke(main, ["--store", store, *command.split(), "--json"])
    assert result.exit_code == 0, result.stderr
    out = json.loads(result.stdout)
    if shape == "one object":
        assert isinstance(out, dict)
        assert set(out) == fields
    else:
        assert isinstance(out, list) and out
        assert all(set(doc) == fields for doc in out)
