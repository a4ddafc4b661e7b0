"""A consumer's scanner built on its own over one ``Quick``'s cluster, for tests that
drive a scan (or the scanner's loop) without a consumer around it."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from quickzones.client import Quick
from quickzones.consumer import ConsumerConfig
from quickzones.consumer.scanner import Scanner
from quickzones.consumer.state import Cluster


def scanner_alone(
    q: Quick,
    config: ConsumerConfig,
    *,
    in_order: bool,
    capacity: int,
    emit: Callable[..., Any] = lambda event, **fields: None,
    **extra: Any,
) -> Scanner:
    """A scanner over ``q``'s cluster with a seeded rng, no election to refresh, in order
    or not, and ``capacity`` free; ``extra``: the rest of :class:`Scanner`'s options."""
    cluster = Cluster(q.zones, q.toplevel)
    return Scanner(
        config,
        {cluster.name: cluster},
        random.Random(1),
        in_order_for=lambda name: in_order,
        refresh_election=lambda: None,
        capacity=lambda: capacity,
        emit=emit,
        **extra,
    )
