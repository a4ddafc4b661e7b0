"""Where a quick process's threads run: on one CPU while they only take turns at the
interpreter lock, spread over the allowed CPUs when they do work in parallel.

A consumer's threads (scanner, managers, workers, flusher) hold the GIL for nearly all they
do, so one process uses about one CPU whatever the host has. Spread over two CPUs, every
short call that lets the GIL go (each SQLite step, each store round trip) hands it to a
thread woken on the other CPU, and the interpreter pays the cross-CPU wake-up and cold
caches each time: on the 2-vCPU host of ``docs/performance.md`` a lone tenant's no-op
items cost 0.71-0.78 ms of CPU each spread and 0.45-0.49 ms on one CPU, and the demo runs
its full rate only on one. So the processes quick starts itself (``quick worker`` and its
``--processes`` children, ``quick demo``) place their threads on one CPU (``auto``), and
this module's governor thread watches whether that holds:

- **Parallel work** (handlers whose C code runs without the GIL: hashing, compression,
  numpy, a child process of their own) cannot be seen from one CPU: a process that waits
  for its CPU may be GIL-bound (each GIL hand-off wakes a thread that then waits for the
  CPU: the demo waited 1.6 s a second) or parallel. So a placed process that uses its
  whole CPU (:data:`BUSY_CPU`) is spread for :data:`PROBE_S` (a *probe*) after
  :data:`FIRST_PROBE_S` of such busy time, then after twice as
  long each time its probe finds it GIL-bound, up to :data:`PROBE_MAX_S`. A probe that
  finds it using more than :data:`PARALLEL_CPU` CPUs (the spread demo used 1.10-1.12,
  four threads hashing 1.97) leaves it spread; spread, a process that stops doing so
  for :data:`CALM_S` is placed on one CPU again.
- **A busy CPU** (another program on it): the process gets less than
  :data:`CONTENDED_CPU` of it while its threads wait to run and other work keeps the rest
  busy, and moves to an allowed CPU that idles clearly more.

Child processes (handlers' subprocesses) inherit their parent thread's CPUs when they start;
the governor counts their threads with the process's own and moves them with it. ``all``
leaves the operating system's placement alone; a list of CPUs places the process there
and nothing moves it. Only Linux can place threads; elsewhere every mode is ``all``.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from quickzones.errors import ConfigurationError

log = logging.getLogger("quick.cpus")

# The environment variable a ``--processes`` child reads its process number (1..N) from:
# child n starts on the n-th allowed CPU (round robin), so siblings do not share one.
PROCESS_NUMBER_ENV = "QUICK_PROCESS_NUMBER"

PERIOD_S = 1.0  # how often the governor looks
# How long a probe keeps the threads spread before its look. A GIL-bound process runs
# worse spread (the module's notes), and its slowest pickups all fell in its probes: with
# a probe of a whole PERIOD_S, `quick demo`'s small tenants' p99 was the three seconds
# of its 20 spread, 12-18 ms against a p50 of 2.5-4. ``/proc``'s schedstat counts in
# nanoseconds: a fifth of a second tells 1.3 CPUs from one.
PROBE_S = 0.2
PARALLEL_CPU = 1.3  # CPUs a spread process uses above which its work runs in parallel
CALM_S = 10.0  # spread, using less than PARALLEL_CPU this long: back to one CPU
FIRST_PROBE_S = 2.0  # busy seconds before a placed process's first probe
PROBE_MAX_S = 60.0  # the longest busy stretch between two probes
# CPUs a placed process uses to count as busy, the only kind that is probed: parallel work
# held to one CPU uses all of it, and a process that leaves some of its CPU idle gains
# nothing from a second (`quick demo`, at 0.6-0.8 of its CPU, paid for each probe with
# its slowest pickups).
BUSY_CPU = 0.9
IDLE_CPU = 0.05  # below this a placed process is idle: nothing to decide, nothing read
# Of its one CPU, with its threads waiting this long a second to run and at least
# OTHER_WORK of that CPU busy with what is not theirs: someone else's CPU, left for one
# that idles at least IDLER more of the time. Waiting alone says nothing: a GIL-bound
# process queues for its own CPU at each hand-off (the demo, alone on the host, 1.6 s a
# second at 0.65 of its CPU, the rest idle), and was moved back and forth every second.
CONTENDED_CPU = 0.7
CONTENDED_WAIT = 0.5
OTHER_WORK = 0.2
IDLER = 0.3


@dataclass(frozen=True, slots=True)
class Usage:
    """The CPU time the process's threads (and its children's) ran and waited to run, in
    seconds since some fixed point."""

    ran_s: float
    waited_s: float


class Cpus(Protocol):
    """The operating system, as the governor sees it (tests pass a fake)."""

    def allowed(self) -> list[int]: ...  # the CPUs this process may use, ascending
    def usage(self) -> Usage: ...  # of the process's threads and its children's
    def own_cpu(self) -> float: ...  # this process's CPU seconds: one cheap call
    def current(self) -> int: ...  # the CPU the calling thread last ran on
    def idle(self) -> dict[int, float]: ...  # each CPU's idle seconds since boot
    def place(self, cpus: set[int]) -> None: ...  # every thread's, children's too


class LinuxCpus:
    """:class:`Cpus` from ``/proc`` and ``sched_setaffinity``."""

    def __init__(self, pid: int | None = None) -> None:
        self.pid = os.getpid() if pid is None else pid
        self._tick = float(os.sysconf("SC_CLK_TCK"))

    @staticmethod
    def available() -> bool:
        return hasattr(os, "sched_setaffinity") and os.path.exists("/proc/self/task")

    def allowed(self) -> list[int]:
        return sorted(os.sched_getaffinity(self.pid))

    def _tasks(self) -> list[int]:
        tasks = _listdir(f"/proc/{self.pid}/task")
        for tid in list(tasks):
            try:
                with open(f"/proc/{self.pid}/task/{tid}/children") as f:
                    children = [int(c) for c in f.read().split()]
            except OSError:
                continue
            for child in children:
                tasks += _listdir(f"/proc/{child}/task")
        return tasks

    def usage(self) -> Usage:
        ran = waited = 0
        for tid in self._tasks():
            try:
                with open(f"/proc/{tid}/schedstat") as f:
                    on_cpu, queued, _ = f.read().split()
            except (OSError, ValueError):
                continue  # ended meanwhile
            ran += int(on_cpu)
            waited += int(queued)
        return Usage(ran / 1e9, waited / 1e9)

    def current(self) -> int:
        with open("/proc/thread-self/stat") as f:
            return int(f.read().rpartition(")")[2].split()[36])  # field 39, "processor"

    def own_cpu(self) -> float:
        times = os.times()
        return times.user + times.system

    def idle(self) -> dict[int, float]:
        idle: dict[int, float] = {}
        with open("/proc/stat") as f:
            for line in f:
                name, _, rest = line.partition(" ")
                if name.startswith("cpu") and name[3:].isdigit():
                    fields = rest.split()
                    idle[int(name[3:])] = (int(fields[3]) + int(fields[4])) / self._tick
        return idle

    def place(self, cpus: set[int]) -> None:
        for tid in self._tasks():
            try:
                os.sched_setaffinity(tid, cpus)
            except OSError:
                continue  # ended meanwhile, or not ours to move


def _listdir(path: str) -> list[int]:
    try:
        return [int(name) for name in os.listdir(path)]
    except OSError:
        return []


def parse_cpus(text: str) -> str | set[int]:
    """``auto``, ``all`` or a list of CPU numbers and ranges (``0,2-3``); a clear error
    for anything else."""
    text = text.strip().lower()
    if text in ("auto", "all"):
        return text
    cpus: set[int] = set()
    try:
        for part in text.split(","):
            low, _, high = part.strip().partition("-")
            first, last = int(low), int(high or low)
            if first < 0 or last < first:
                raise ValueError(part)
            cpus.update(range(first, last + 1))
    except ValueError:
        raise ConfigurationError(
            f"--cpus takes auto, all or CPU numbers like 0,2-3, not {text!r}"
        ) from None
    return cpus


class CpuPlacement:
    """Places this process's threads (``mode``: ``auto``, ``all`` or a set of CPUs) and,
    for ``auto``, keeps them placed as the module says. ``first``: the index into the
    allowed CPUs an ``auto`` process starts on (a ``--processes`` child's number); None:
    the one it runs on as it starts. ``clock`` gives monotonic seconds."""

    def __init__(
        self,
        mode: str | set[int],
        cpus: Cpus | None = None,
        *,
        first: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        period_s: float = PERIOD_S,
        probe_s: float = PROBE_S,
    ) -> None:
        self.cpus: Cpus | None = (
            cpus if cpus is not None else (LinuxCpus() if LinuxCpus.available() else None)
        )
        self.mode = mode
        self.clock = clock
        self.period_s = period_s
        self.probe_s = probe_s
        self.allowed: list[int] = [] if self.cpus is None else self.cpus.allowed()
        self.placed: int | None = None  # the one CPU, or None while spread
        if isinstance(mode, set):
            outside = sorted(mode - set(self.allowed)) if self.cpus is not None else []
            if outside:
                raise ConfigurationError(
                    f"--cpus {_listed(mode)}: CPU {_listed(set(outside))} is not one this "
                    f"process may use ({_listed(set(self.allowed))}); give some of those, "
                    "or --cpus auto"
                )
        self._first = first
        self._last: tuple[float, Usage, dict[int, float]] | None = None
        self._own = (0.0, 0.0)  # this process's CPU seconds at the last look, and when
        self._stale = False  # the last full reading is from before an idle stretch
        self._spread_since = 0.0  # when it was last spread (auto)
        self._busy_since: float | None = None  # spread and using > PARALLEL_CPU since
        self._probing = False
        self._probed_from = 0
        self._busy_s = 0.0  # busy seconds placed since the last probe
        self._probe_in = FIRST_PROBE_S
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._moved = False  # placed something that stop() gives back

    @property
    def governs(self) -> bool:
        """Whether ``auto`` has something to decide: Linux and two CPUs or more."""
        return self.mode == "auto" and self.cpus is not None and len(self.allowed) > 1

    def start(self, *, governor: bool = True) -> None:
        """Place the threads now and, for ``auto``, start the governor thread (False: the
        caller calls :meth:`step` itself, as the tests do)."""
        if self.cpus is None or self.mode == "all":
            return
        if isinstance(self.mode, set):
            self.cpus.place(self.mode)
            self._moved = True
            log.info("threads placed on CPU %s (--cpus)", _listed(self.mode))
            return
        if not self.governs:
            return
        self._place_one(self._starting_cpu(), "start")
        self._last = self._reading()
        self._own = self.cpus.own_cpu(), self.clock()
        if not governor:
            return
        self._thread = threading.Thread(target=self._run, name="quick-cpus", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the governor and give the threads back the CPUs they had: a command run
        inside another process (a test's CliRunner, an application calling it) leaves
        that process as it found it."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5.0)  # no look may place anything after this
        if self._moved and self.cpus is not None:
            self._moved = False
            self.cpus.place(set(self.allowed))

    def next_look_s(self) -> float:
        """How long the governor waits for its next look: a probe's look comes after
        ``probe_s``, every other after ``period_s``."""
        return self.probe_s if self._probing else self.period_s

    def _run(self) -> None:
        while not self._stop.wait(self.next_look_s()):
            try:
                self.step()
            except Exception:  # placement is an optimisation: never stop the process
                log.debug("cpu placement step failed", exc_info=True)

    def _reading(self) -> tuple[float, Usage, dict[int, float]]:
        assert self.cpus is not None
        return self.clock(), self.cpus.usage(), self.cpus.idle()

    def _starting_cpu(self) -> int:
        if self._first is not None:
            return self.allowed[self._first % len(self.allowed)]
        assert self.cpus is not None
        # The CPU the scheduler runs this thread on now: free enough for it, and free to
        # find (a busy one is left at the first look that sees it: move).
        cpu = self.cpus.current()
        return cpu if cpu in self.allowed else self.allowed[0]

    def _idlest(self, before: dict[int, float], after: dict[int, float]) -> int:
        return max(self.allowed, key=lambda c: (after.get(c, 0.0) - before.get(c, 0.0), -c))

    def step(self) -> str:
        """One look: what it decided (``stay``, ``probe``, ``place``, ``move``), from the
        usage since the last look."""
        assert self.cpus is not None and self._last is not None
        # An idle placed process is looked at with one cheap call, not the reading of
        # every thread's /proc files (an idle worker's CPU is a target: issue 44 point 4).
        own, own_at = self.cpus.own_cpu(), self.clock()
        own_before, own_then = self._own
        self._own = own, own_at
        placed_idle = self.placed is not None and not self._probing and own_at > own_then
        if placed_idle and (own - own_before) / (own_at - own_then) < IDLE_CPU:
            self._stale = True
            return "stay"
        if self._stale:  # busy again: measure from now
            self._stale = False
            self._last = self._reading()
            return "stay"
        then, was, idle_then = self._last
        now, usage, idle = self._last = self._reading()
        wall = now - then
        if wall <= 0:
            return "stay"
        ran = (usage.ran_s - was.ran_s) / wall
        waited = (usage.waited_s - was.waited_s) / wall
        if self.placed is not None:
            if ran < CONTENDED_CPU and waited > CONTENDED_WAIT:
                idling = {c: (idle.get(c, 0.0) - idle_then.get(c, 0.0)) / wall for c in idle}
                idlest = self._idlest(idle_then, idle)
                others = 1.0 - idling.get(self.placed, 0.0) - ran  # its CPU's, not its own
                if (
                    others >= OTHER_WORK
                    and idling.get(idlest, 0.0) - idling.get(self.placed, 0.0) >= IDLER
                ):
                    self._place_one(idlest, f"CPU {self.placed} is busy with other work")
                    return "move"
            if ran > BUSY_CPU:
                self._busy_s += wall
                if self._busy_s >= self._probe_in:
                    self._busy_s = 0.0
                    self._probe_in = min(self._probe_in * 2, PROBE_MAX_S)
                    self._probed_from = self.placed
                    self._probing = True
                    self._spread(now, None)
                    return "probe"
            return "stay"
        # Spread: parallel work keeps it so; a probe that found GIL-bound work goes back
        # to its CPU at once, a spread process whose parallel work ended after CALM_S.
        if ran > PARALLEL_CPU:
            self._busy_since = now
            if self._probing:
                self._probing = False
                log.info("threads spread over CPUs %s: they use %.1f CPUs",
                         _listed(set(self.allowed)), ran)  # fmt: skip
            return "stay"
        if self._probing:
            self._probing = False
            self._place_one(self._probed_from, None)
            return "place"
        if now - max(self._spread_since, self._busy_since or 0.0) >= CALM_S:
            self._probe_in = FIRST_PROBE_S
            self._place_one(self._idlest(idle_then, idle), "their work is GIL-bound again")
            return "place"
        return "stay"

    def _place_one(self, cpu: int, why: str | None) -> None:
        assert self.cpus is not None
        self._moved = True
        self.cpus.place({cpu})
        self.placed = cpu
        if why is not None:
            log.info("threads placed on CPU %d (%s; --cpus all spreads them)", cpu, why)

    def _spread(self, now: float, why: str | None) -> None:
        assert self.cpus is not None
        self.cpus.place(set(self.allowed))
        self.placed = None
        self._spread_since = now
        self._busy_since = None
        if why is not None:
            log.info("threads spread over CPUs %s: %s", _listed(set(self.allowed)), why)


def _listed(cpus: Iterable[int]) -> str:
    return ",".join(str(c) for c in sorted(cpus))


def placement_from_env(mode: str | set[int]) -> CpuPlacement:
    """The placement of a ``quick worker`` process: a ``--processes`` child starts on the
    allowed CPU its number picks (:data:`PROCESS_NUMBER_ENV`)."""
    number = os.environ.get(PROCESS_NUMBER_ENV)
    first = int(number) - 1 if number and number.isdigit() and int(number) > 0 else None
    return CpuPlacement(mode, first=first)
