"""A small pool of daemon threads.

The standard ThreadPoolExecutor joins its threads at interpreter exit, so one handler stuck
in a blocking call would keep a stopped worker process alive forever. Daemon threads let
the consumer give back the stuck item's lease at its shutdown deadline and exit.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

_STOP = object()


class DaemonPool:
    """``submit`` returns a Future; ``shutdown`` waits at most until a deadline."""

    def __init__(self, size: int, name: str) -> None:
        self._queue: queue.Queue[Any] = queue.Queue()
        self._threads = [
            threading.Thread(target=self._loop, name=f"{name}-{i}", daemon=True)
            for i in range(size)
        ]
        for t in self._threads:
            t.start()

    def _loop(self) -> None:
        while True:
            try:
                task = self._queue.get()
            except BaseException:
                # A stray asynchronous exception (an interrupt meant for a handler that
                # already returned): a worker thread must survive anything.
                continue
            if task is _STOP:
                return
            try:
                self._run(task)
            except BaseException:
                continue  # as above: never let the thread die

    @staticmethod
    def _run(task: Any) -> None:
        future, fn, args = task
        if future is None:  # post(): nobody waits for the result
            try:
                fn(*args)
            except BaseException:  # posted tasks handle and log their own errors
                pass
            return
        if not future.set_running_or_notify_cancel():
            return
        try:
            future.set_result(fn(*args))
        except BaseException as err:  # handed to whoever waits on the future
            future.set_exception(err)

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        future: Future[Any] = Future()
        self._queue.put((future, fn, args))
        return future

    def post(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on the pool without a Future: the cheap path for the
        per-item hand-off from managers to workers."""
        self._queue.put((None, fn, args))

    def drain(self) -> list[tuple[Callable[..., Any], tuple[Any, ...]]]:
        """Take back the posted tasks no thread has started yet, as (fn, args)."""
        taken: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []
        keep: list[Any] = []
        while True:
            try:
                task = self._queue.get_nowait()
            except queue.Empty:
                break
            if task is not _STOP and task[0] is None:
                taken.append((task[1], task[2]))
            else:
                keep.append(task)
        for task in keep:
            self._queue.put(task)
        return taken

    def shutdown(self, deadline: float) -> bool:
        """Let queued tasks run, then stop; True if every thread ended by ``deadline``
        (a ``time.monotonic()`` value)."""
        for _ in self._threads:
            self._queue.put(_STOP)
        for t in self._threads:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in self._threads)
