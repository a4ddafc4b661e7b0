"""Deterministic simulation of quick over the seeded FDB simulator (``MemoryStore``).

One thread, one virtual clock, one ``random.Random(seed)`` choosing every interleaving of
producers, consumers' separate steps, clock jumps, elections and crashes; invariants are
checked after every step (incrementally) and on the committed store state every K steps
and at quiescence. ``python -m quickzones.testing.simulation --seeds 50 --steps 2000`` runs it.
"""

from quickzones.testing.simulation.harness import Simulation, run_seed
from quickzones.testing.simulation.model import SimConfig, SimResult, Violation, effect_key

__all__ = ["SimConfig", "SimResult", "Simulation", "Violation", "effect_key", "run_seed"]
