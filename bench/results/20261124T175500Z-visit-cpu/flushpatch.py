import os, runpy, sys, time, queue
import quickzones.consumer.completer as comp
PAUSE = float(os.environ.get("FLUSH_PAUSE_S", "0.01"))
def run(self, stopping):
    while not stopping.is_set():
        try:
            first = self._pending.get(timeout=0.05)
        except queue.Empty:
            continue
        self._pending.put(first)
        try:
            self.flush()
        except Exception:
            pass
        stopping.wait(PAUSE)
comp.BatchedCompleter.run = run
assert sys.argv[1] == "-m"
mod = sys.argv[2]
sys.argv = [mod] + sys.argv[3:]
runpy.run_module(mod, run_name="__main__", alter_sys=True)
