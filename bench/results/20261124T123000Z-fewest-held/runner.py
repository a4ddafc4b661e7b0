"""The consumer process of ab.py: bench.quickrun's job on the peer fairness profile.

NOHELD=1 turns the fewest-held-first ordering off (the scanner's ``held`` -> 0), so the
same code runs both sides; CTXOUT=FILE writes the context switches per thread at SIGTERM.
"""

import collections
import glob
import json
import os
import signal
import sys
import threading

from bench.quickrun import open_quick
from quickzones.consumer import ConsumerConfig
import quickzones.consumer.scanner as scanner

if os.environ.get("NOHELD"):
    _init = scanner.Scanner.__init__

    def init(self, *a, **k):
        _init(self, *a, **k)
        self.held = lambda ref: 0

    scanner.Scanner.__init__ = init


def context_switches() -> dict[str, int]:
    out: collections.Counter[str] = collections.Counter()
    names = {th.native_id: th.name for th in threading.enumerate()}
    for task in glob.glob("/proc/self/task/*"):
        try:
            name = names.get(int(task.rsplit("/", 1)[1]), "?")
            status = open(task + "/status").read()
        except OSError:
            continue
        voluntary = int(status.split("\nvoluntary_ctxt_switches:")[1].split()[0])
        forced = int(status.split("nonvoluntary_ctxt_switches:")[1].split()[0])
        out[name.rstrip("0123456789_-")] += voluntary + forced
    return dict(out)


url, cfg = sys.argv[1], sys.argv[2]
q = open_quick(url)
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())
c = q.consumer(ConsumerConfig(**json.loads(cfg)))
c.start()
stop.wait(3600)
if os.environ.get("CTXOUT"):
    with open(os.environ["CTXOUT"], "w") as f:
        json.dump(context_switches(), f)
c.stop(deadline_s=5.0)
q.close()
