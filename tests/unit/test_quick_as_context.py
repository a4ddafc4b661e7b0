"""``with Quick.open(url) as q:`` closes the store on the way out, as the CLI's commands
use it (one pattern, twenty copies of try/finally before)."""

from __future__ import annotations

from pathlib import Path

import pytest

from quickzones.client import Quick
from quickzones.errors import StorageError


def test_a_quick_used_with_with_closes_its_store_and_keeps_what_it_wrote(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'q.db'}"
    with Quick.open(url) as q:
        item_id = q.enqueue("job", {"n": 1}, app="a", tenant="t")
    with pytest.raises(StorageError, match="closed"):
        q.enqueue("job", {"n": 2}, app="a", tenant="t")
    with Quick.open(url) as again:
        assert again.get("a", "t", item_id) is not None
