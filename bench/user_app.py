"""The benchmarks' handlers as a user's module: ``quick worker --app-module bench.user_app:q``.

The store comes from ``QUICK_STORE``, as a user's module would take it, and the consumer is
whatever ``quick worker`` builds from its defaults: no profile, no tuning. The figures the
docs cite are measured this way (issue 27 point 5); a tuned profile may stand beside them.
"""

from __future__ import annotations

import os

from bench.quickrun import open_quick

q = open_quick(os.environ["QUICK_STORE"])

