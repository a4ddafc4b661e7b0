"""Issue 41 point 14b: a chain longer than its record can hold is refused at enqueue with
an error that names the maximum, before anything is written. A chain keeps its later
steps in one record of the store; past about 1,450 small steps that record outgrew a
stored value's 100,000 bytes and the enqueue raised the store's raw ``value_too_large``."""

from __future__ import annotations

from typing import Any

import pytest

from quickzones.batches import Job
from quickzones.client import Quick
from quickzones.errors import InvalidArgument
from quickzones.store import admin
from quickzones.store.batches import MAX_CHAIN_STEPS


def _steps(n: int, payload: Any = None) -> list[Job]:
    return [Job("step", {"n": i} if payload is None else payload, tenant="t") for i in range(n)]


def _nothing_written(q: Quick) -> bool:
    return admin.active_zones(q) == [] and q.get("a", "t", "x") is None


def test_a_chain_past_the_maximum_is_refused_naming_it(q: Quick) -> None:
    for n in (MAX_CHAIN_STEPS + 1, 1_500):
        with pytest.raises(InvalidArgument) as refused:
            q.chain(*_steps(n), app="a")
        assert f"at most {MAX_CHAIN_STEPS:,} steps" in str(refused.value)
        assert refused.value.name == "steps"
    assert _nothing_written(q)


def test_a_chain_whose_steps_are_too_large_is_refused_naming_how_many_fit(q: Quick) -> None:
    """Fewer steps than the maximum, but each with a 2 kB payload: the steps after the
    first do not fit one record; the error says how many steps of that size do."""
    with pytest.raises(InvalidArgument) as refused:
        q.chain(*_steps(60, {"blob": "x" * 2_000}), app="a")
    message = str(refused.value)
    assert "100,000 bytes" in message and "steps of this size" in message, message
    assert _nothing_written(q)
    # As many as it said fit are enqueued.
    fit = int(message.split("at most ")[1].split(" steps of this size")[0].replace(",", ""))
    assert 40 <= fit < 60, message
    chain = q.chain(*_steps(fit, {"blob": "x" * 2_000}), app="a")
    assert len(chain.item_ids) == fit


def test_a_chain_at_the_maximum_is_enqueued(q: Quick) -> None:
    chain = q.chain(*_steps(MAX_CHAIN_STEPS), app="a")
    assert len(chain.item_ids) == MAX_CHAIN_STEPS
    assert q.get("a", "t", chain.item_ids[0]) is not None
