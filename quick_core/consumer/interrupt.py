"""Interrupting a handler thread: the lease extender does it when a lease is lost, the
execution bound when a handler overruns.

CPython can raise an exception asynchronously in another thread; it lands at the next
bytecode boundary, so it stops Python code but not a blocking C call. Handlers that block
for long should also watch ``ctx.lease_lost``.
"""

from __future__ import annotations

import ctypes
import threading


class HandlerInterrupted(BaseException):
    """Raised inside a handler thread to stop it. BaseException so ``except Exception``
    in user code does not swallow it."""


class LeaseInterrupted(HandlerInterrupted):
    """The item's lease was lost while its handler ran."""


class ExecutionBoundExceeded(HandlerInterrupted):
    """The handler ran longer than its job type's execution bound."""


class ShutdownInterrupted(HandlerInterrupted):
    """The consumer's shutdown deadline passed while the handler ran."""


def interrupt_thread(thread_id: int, exc: type[HandlerInterrupted]) -> bool:
    """Raise ``exc`` in the thread with ``thread_id``; False if no such thread."""
    done = ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread_id), ctypes.py_object(exc)
    )
    if done > 1:  # more than one thread state touched: undo, as the C API asks
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), None)
        return False
    return bool(done == 1)


def clear_pending_interrupt() -> None:
    """Drop an interrupt sent to the calling thread that has not landed yet: called when a
    handler invocation ends, so a late interrupt cannot hit the code (or the next handler)
    that runs on this thread afterwards."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(threading.get_ident()), None)
