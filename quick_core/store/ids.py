"""Where random ids come from: item ids, lease ids, pointer ids.

Every component that makes ids takes an :data:`IdSource` in its constructor and defaults to
:func:`random_ids` (``secrets``): a lease id must be unguessable, so no one completes an
item by guessing. A deterministic run (the simulation) passes :class:`SeededIds` instead of
patching anything.
"""

from __future__ import annotations

import random
import secrets
from collections.abc import Callable

# ``ids(nbytes)``: ``nbytes`` random bytes as lowercase hex.
IdSource = Callable[[int], str]


def random_ids(nbytes: int) -> str:
    """Unguessable ids from ``secrets``: the default everywhere."""
    return secrets.token_hex(nbytes)


class SeededIds:
    """Ids drawn from one seeded generator: one seed, one sequence of ids. For replayable
    runs only; they are guessable. Draws stay 64 to 128 bits, so ids stay unique."""

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)

    def __call__(self, nbytes: int) -> str:
        return self._rng.randbytes(nbytes).hex()
