"""``python -m quickzones.testing.simulation --seeds N --steps S [--seed X] [--faults F]``.

Runs seeds 0..N-1 (or the one ``--seed``), prints every failing seed with the command that
replays it, and a summary line; exits 1 on any violation.
"""

from __future__ import annotations

import sys

from quickzones.testing.simulation.cli import main

if __name__ == "__main__":
    sys.exit(main())
