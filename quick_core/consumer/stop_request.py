"""How ``run_forever`` is asked to stop: by SIGTERM or SIGINT, by ``stop()`` from any
thread, or by the consumer itself (its store was lost); and ``run_forever`` itself.

A signal handler runs in the main thread between two bytecodes, possibly while that
thread holds a lock, and a second signal can arrive while the first handler runs: a
handler that takes a lock (``Event.set``, logging) can deadlock the process (issue 28,
point 14). So the handler only sets a flag and writes one byte to a pipe (the
self-pipe), which wakes the main thread's wait; everything else (logging, the shutdown)
happens in the main thread afterwards.

The shutdown itself keeps its deadline whatever the store does (issue 41 point 6): with
the PostgreSQL server away, giving back leases, flushing completions and releasing the
election each waited out run()'s minute of retries, and ``quick worker`` took about 105 s
to end against a 10 s deadline. It runs in a thread of its own, waited for until the
deadline and :data:`SETTLE_S` more; past that it is left behind (logged) and what it
still holds goes back to its zones when the leases expire, as after a crash.
"""

from __future__ import annotations

import logging
import os
import select
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import TYPE_CHECKING, Any

from quickzones.errors import StoreLost

if TYPE_CHECKING:
    from quickzones.consumer.config import ConsumerConfig

log = logging.getLogger("quick.consumer")

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
# After the shutdown deadline, the time left to give back what is held, flush completions
# and release the election, before a shutdown the store does not answer is left behind.
SETTLE_S = 2.0


class StopRequest:
    """A flag any thread or signal handler sets (:meth:`request`), and a wait on it."""

    def __init__(self) -> None:
        self.requested = False
        self.signum: int | None = None  # the first signal that asked, if one did
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)
        # Held by request() (never by the signal handler) and by closing the pipe: a
        # thread's late request() must not write into a descriptor reused since.
        self._pipe_lock = threading.Lock()
        self._closed = False

    def request(self) -> None:
        """Ask to stop, from any thread (not from a signal handler: it takes a lock), and
        wake :meth:`wait` at once."""
        self.requested = True
        with self._pipe_lock:
            if not self._closed:
                self._wake()

    def _wake(self) -> None:
        try:
            os.write(self._write, b"\0")  # wakes wait(); a full pipe is awake already
        except OSError:
            pass

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is None:
            self.signum = signum
        self.requested = True
        self._wake()  # installed only while the pipe is open (on_signals)

    def wait(self, timeout_s: float | None) -> bool:
        """Wait until a stop is requested (a signal or :meth:`request` wakes it at once),
        at most ``timeout_s`` (None: no limit); returns whether one was."""
        if not self.requested:
            select.select([self._read], [], [], timeout_s)
            try:
                while os.read(self._read, 512):
                    pass
            except OSError:
                pass  # drained (EAGAIN)
        return self.requested

    @contextmanager
    def on_signals(self, install: bool = True) -> Iterator[None]:
        """SIGTERM and SIGINT request a stop while inside; the previous handlers are put
        back on the way out, before the pipe closes."""
        previous: dict[int, Any] = {}
        wakeup: int | None = None
        try:
            if install:
                for signum in STOP_SIGNALS:
                    previous[signum] = signal.signal(signum, self._on_signal)
                # The kernel may hand the signal to any thread (a handler's kill() of its
                # own process; Ctrl-C's SIGINT): only the main thread runs the handler
                # above, and a signal taken by another thread does not interrupt its wait
                # on the pipe. Python's C-level handler writes to the wakeup fd from
                # whichever thread takes it, so that wait ends and the handler runs.
                wakeup = signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)
            yield
        finally:
            if wakeup is not None:
                signal.set_wakeup_fd(wakeup)
            for number, handler in previous.items():
                signal.signal(number, handler)
            with self._pipe_lock:
                self._closed = True
                os.close(self._read)
                os.close(self._write)


class RunsForever:
    """``run_forever`` and ``stop`` of a consumer whose ``start`` starts its threads and
    ``_stop`` shuts them down; ``_store_lost`` is what its scanner calls on a lost
    store."""

    config: ConsumerConfig
    _stop_lock: threading.Lock
    _run_request: StopRequest | None
    lost: StoreLost | None
    _lost_lock: threading.Lock

    def start(self) -> None:
        raise NotImplementedError

    def _stop(self, deadline_s: float | None) -> None:
        raise NotImplementedError

    def stop(self, deadline_s: float | None = None) -> None:
        """Stop taking work; let running handlers finish until the deadline, give back
        the leases of everything not finished, flush completions. From any thread:
        :meth:`run_forever` then returns; a second call waits for the first."""
        request = self._run_request
        if request is not None:
            request.request()
        self._shutdown(deadline_s)

    def request_stop(self) -> None:
        """Ask to stop and return at once (from any thread): :meth:`run_forever` then
        shuts down as :meth:`stop` does and returns; threads started by :meth:`start`
        stop taking work."""
        request = self._run_request
        if request is not None:
            request.request()  # wakes run_forever's wait
        self._stopping_requested()

    def _stopping_requested(self) -> None:
        """What a consumer does at once on :meth:`request_stop`."""

    def _shutdown(self, deadline_s: float | None) -> None:
        """``_stop(deadline_s)``, waited for until the deadline and :data:`SETTLE_S`
        more; a shutdown still waiting on the store then is left behind (logged)."""
        grace = self.config.shutdown_deadline_s if deadline_s is None else deadline_s
        failure: list[BaseException] = []

        def shut_down() -> None:
            try:
                with self._stop_lock:  # one shutdown at a time; a second waits for it
                    self._stop(deadline_s)
            except BaseException as err:  # raised in the caller's thread below
                failure.append(err)

        thread = threading.Thread(target=shut_down, name="quick-shutdown", daemon=True)
        started = time.monotonic()
        thread.start()
        thread.join(grace + SETTLE_S)
        if thread.is_alive():
            log.warning(
                "shutdown not finished %.1f s after it began (deadline %g s): the store does "
                "not answer; what this consumer still holds goes back to its zones when the "
                "leases expire", time.monotonic() - started, grace,
            )  # fmt: skip
        elif failure:
            raise failure[0]

    def run_forever(self, *, install_signals: bool = True) -> None:
        """Run until SIGTERM or SIGINT, :meth:`stop` from any thread, or the loss of the
        store, then shut down gracefully. A lost store (:class:`StoreLost`: its file
        deleted or replaced) is raised once shut down, so the process exits non-zero
        and its supervisor starts it again on the store there now."""
        self._run_request = request = StopRequest()
        with request.on_signals(install_signals):
            try:
                self.start()
                # Woken by a signal, stop(), request_stop() or a lost store: an idle
                # worker's main thread sleeps (it woke every 200 ms, issue 44 point 4).
                while not request.wait(None) and self.lost is None:
                    pass
                if request.signum is not None:
                    log.info("signal %d: shutting down", request.signum)
            finally:
                self._run_request = None
                self._shutdown(None)
        if self.lost is not None:
            raise self.lost

    def _store_lost(self, err: StoreLost) -> None:
        """The store went away under this consumer: said once, at ERROR; run_forever
        then stops and raises it."""
        with self._lost_lock:
            if self.lost is not None:
                return
            self.lost = err
        log.error("%s", err)
        request = self._run_request
        if request is not None:
            request.request()  # wakes run_forever's wait: it stops and raises this
