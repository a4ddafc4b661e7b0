"""Worker processes past the GIL: a supervisor that keeps N consumer processes running.

One consumer process runs its handlers, its scanner and its managers under one
interpreter lock, so it uses about one core. :class:`Supervisor` starts N children (each a
``quick worker`` of its own: its own consumer, scanner and election entry, exactly as if
started by hand), restarts one that dies with a growing delay (logged), and on SIGTERM or
SIGINT passes the signal on and returns once every child has exited: each child stops
gracefully, giving back the leases of what it did not finish, so no item is lost.

The consumers share nothing but the store, as the paper's consumers do; what they share
for metrics (one endpoint for all of them) is :class:`~quickzones.consumer.metrics.SharedMetrics`,
given in as ``env`` and ``on_exit``.

A child does not outlive its supervisor (issue 41 point 4: after ``kill -9`` of the
supervisor its 3 children kept running, and nobody would ever stop or restart them).
Each child is told its supervisor's pid (:data:`SUPERVISOR_ENV`) and calls
:func:`follow_supervisor`: on Linux the kernel sends it SIGTERM when the supervisor dies
(``prctl(PR_SET_PDEATHSIG)``), and everywhere a thread watches its parent pid; either
way it stops as on SIGTERM, giving back what it holds.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from types import FrameType

from quickzones.cpu_placement import PROCESS_NUMBER_ENV

log = logging.getLogger("quick.supervisor")

# The environment variable that tells a child its supervisor's pid (follow_supervisor).
SUPERVISOR_ENV = "QUICK_SUPERVISOR_PID"
PARENT_CHECK_S = 1.0  # how often a child looks at its parent where the kernel cannot tell
_PR_SET_PDEATHSIG = 1


@dataclass(slots=True)
class Backoff:
    """The delay before a dead child is started again: ``first_s``, doubled for each death
    in a row, at most ``max_s``; a child that ran ``stable_s`` starts the count afresh."""

    first_s: float = 1.0
    max_s: float = 30.0
    stable_s: float = 60.0

    def delay(self, deaths_in_a_row: int) -> float:
        return min(self.max_s, self.first_s * 2.0 ** max(0, deaths_in_a_row - 1))


@dataclass(slots=True)
class _Slot:
    """One of the N processes: its number (1..N), its current child, when it started and
    how many times in a row it died young."""

    number: int
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    deaths: int = 0
    restart_at: float | None = None
    exits: list[int] = field(default_factory=list)


class Supervisor:
    """Runs ``command`` as ``processes`` children until a stop.

    ``env``: the children's environment (None: this process's). ``on_exit(pid)`` runs once
    each child has exited (the shared metrics forget its live gauges). ``say`` reports each
    start and the stop (the CLI prints it; default: INFO log); a death is always a WARNING
    log line. ``clock`` is monotonic seconds (injected by tests)."""

    def __init__(
        self,
        command: Sequence[str],
        processes: int,
        *,
        env: Mapping[str, str] | None = None,
        backoff: Backoff | None = None,
        on_exit: Callable[[int], None] = lambda pid: None,
        say: Callable[[str], None] = log.info,
        clock: Callable[[], float] = time.monotonic,
        poll_s: float = 0.1,
    ) -> None:
        if processes < 1:
            raise ValueError(f"processes must be at least 1, not {processes}")
        self.command = list(command)
        self.backoff = backoff or Backoff()
        self.on_exit = on_exit
        self.say = say
        self.clock = clock
        self.poll_s = poll_s
        self.slots = [_Slot(n) for n in range(1, processes + 1)]
        # Each child knows whose death must stop it (follow_supervisor).
        self.env = {**(os.environ if env is None else env), SUPERVISOR_ENV: str(os.getpid())}
        self._stop = threading.Event()
        self._signal = signal.SIGTERM

    def pids(self) -> dict[int, int]:
        """The running children's pids, by process number."""
        return {
            s.number: s.proc.pid for s in self.slots if s.proc is not None and s.proc.poll() is None
        }

    def request_stop(self, signum: int = signal.SIGTERM) -> None:
        """Stop: pass ``signum`` on to every child and restart none (thread-safe)."""
        self._signal = signal.Signals(signum)
        self._stop.set()

    def run(self, *, install_signals: bool = True) -> int:
        """Start the children and keep them running until SIGTERM/SIGINT (or
        :meth:`request_stop`); then pass the signal on and wait for every child. Returns 0
        when every child stopped cleanly, else 1."""
        if install_signals:

            def on_signal(signum: int, frame: FrameType | None) -> None:
                log.info("signal %d: stopping %d processes", signum, len(self.slots))
                self.request_stop(signum)

            signal.signal(signal.SIGTERM, on_signal)
            signal.signal(signal.SIGINT, on_signal)
        for slot in self.slots:
            self._start(slot)
        while not self._stop.wait(self.poll_s):
            for slot in self.slots:
                self._tend(slot)
        return self._stop_all()

    def _start(self, slot: _Slot) -> None:
        # Its number: a child places its threads on a CPU of its own (cpu_placement).
        env = {**self.env, PROCESS_NUMBER_ENV: str(slot.number)}
        slot.proc = subprocess.Popen(self.command, env=env)
        slot.started = self.clock()
        slot.restart_at = None
        self.say(f"process {slot.number} started (pid {slot.proc.pid})")

    def _tend(self, slot: _Slot) -> None:
        """Reap a dead child and schedule its restart; start it again when due."""
        now = self.clock()
        if slot.proc is not None:
            code = slot.proc.poll()
            if code is None:
                return
            pid = slot.proc.pid
            self.on_exit(pid)
            slot.proc = None
            ran = now - slot.started
            slot.deaths = 1 if ran >= self.backoff.stable_s else slot.deaths + 1
            wait = self.backoff.delay(slot.deaths)
            slot.restart_at = now + wait
            log.warning(
                "process %d (pid %d) died (%s) after %.1fs; restarting in %gs",
                slot.number, pid, _how(code), ran, wait,
            )  # fmt: skip
        if slot.restart_at is not None and now >= slot.restart_at and not self._stop.is_set():
            self._start(slot)

    def _stop_all(self) -> int:
        running = [s.proc for s in self.slots if s.proc is not None and s.proc.poll() is None]
        for proc in running:
            try:
                proc.send_signal(self._signal)
            except ProcessLookupError:  # it exited since the poll
                pass
        clean = True
        for slot in self.slots:
            if slot.proc is None:
                continue
            code = slot.proc.wait()  # each child keeps its own shutdown deadline
            self.on_exit(slot.proc.pid)
            # Killed by the signal itself: it came before the child's handlers were in
            # place, so before its consumer started (it held nothing).
            if code not in (0, -self._signal):
                clean = False
                log.warning("process %d (pid %d) stopped (%s)", slot.number, slot.proc.pid,
                            _how(code))  # fmt: skip
            slot.proc = None
        self.say(f"all {len(self.slots)} processes stopped")
        return 0 if clean else 1


def _how(code: int) -> str:
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


def follow_supervisor(environ: MutableMapping[str, str] = os.environ) -> None:
    """In a child of a :class:`Supervisor` (``environ`` names its pid, taken out so the
    handlers' own subprocesses do not inherit it): stop as on SIGTERM once the supervisor
    is gone. On Linux the kernel sends the signal; a thread watching the parent pid covers
    other systems and says why in the log. Elsewhere a no-op."""
    text = environ.pop(SUPERVISOR_ENV, None)
    if not text or not text.isdigit():
        return
    supervisor = int(text)
    if sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):  # no libc (a static build): the watch remains
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    # Also for a supervisor that died before the prctl above (the kernel will not tell).
    threading.Thread(
        target=_watch_parent, args=(supervisor,), name="quick-supervisor-watch", daemon=True
    ).start()


def _watch_parent(supervisor: int) -> None:
    while os.getppid() == supervisor:
        time.sleep(PARENT_CHECK_S)
    log.warning("the supervisor (pid %d) is gone: this worker stops", supervisor)
    os.kill(os.getpid(), signal.SIGTERM)


def worker_command(
    app_module: str, worker_args: Sequence[str] = (), *, verbose: int = 0
) -> list[str]:
    """The command line of one ``quick worker`` child: this interpreter, ``-m quickzones``."""
    return [
        sys.executable, "-m", "quickzones", *(["-v"] * verbose),
        "worker", "--app-module", app_module, *worker_args,
    ]  # fmt: skip
