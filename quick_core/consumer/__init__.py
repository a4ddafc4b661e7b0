"""Consumers, one module per mechanism of the paper (section 4):

* :mod:`.scanner`: the Scanner, Algorithm 1 (which zones to visit);
* :mod:`.manager`: a Manager's zone visit, Algorithm 2 (lease a pointer, dequeue items);
* :mod:`.worker`: a Worker, Algorithm 3 (run one leased item), with :mod:`.failure`
  (retry with backoff, dead letters, nacks);
* :mod:`.completer`: completes finished items, inline or batched per zone;
* :mod:`.lease_extender`: keeps running items' leases alive;
* :mod:`.runtime`: the :class:`Consumer` that wires them and starts them on threads;
* :mod:`.state`, :mod:`.events`, :mod:`.slots`: what they share.
"""

from __future__ import annotations

from quickzones.consumer.config import ConsumerConfig
from quickzones.consumer.events import LOGGED_EVENTS, Events, Observer
from quickzones.consumer.runtime import Consumer
from quickzones.consumer.state import Cluster, InFlight, Running, Work

__all__ = [
    "LOGGED_EVENTS",
    "Cluster",
    "Consumer",
    "ConsumerConfig",
    "Events",
    "InFlight",
    "Observer",
    "Running",
    "Work",
]
