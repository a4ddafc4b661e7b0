"""Waits on libfdb_c's futures that leave the client's network thread to the network.

The binding's ``Future.block_until_ready`` waits on a semaphore that a Python callback
releases, and libfdb_c runs that callback on its one network thread, which must take the
GIL to run it. In a consumer process a dozen threads (managers, workers, the completer)
take the GIL in turn, so on every reply the network thread waits for the GIL, and every
transaction of the process waits behind that thread. A thread other than the main one
waits in libfdb_c instead (``fdb_future_block_until_ready`` through ctypes, which drops
the GIL for the call); the network thread then wakes it without running Python.

The main thread keeps the binding's wait: blocked inside a C call it could not run a
signal handler (Ctrl-C, SIGTERM's) until the reply came, which is why the binding waits
in Python. Nothing else changes: a wait still returns when the future is ready, with its
value or its error.
"""

from __future__ import annotations

import threading
from typing import Any

_MARK = "_quick_waits_in_libfdb_c"


def install(fdb: Any) -> None:
    """Make ``fdb``'s futures wait in libfdb_c from any thread but the main one; once per
    process (a second call changes nothing). A binding without ``fdb.impl.Future`` (the
    simulator standing in for it) is left as it is."""
    future: Any = getattr(getattr(fdb, "impl", None), "Future", None)
    binding_wait = getattr(future, "block_until_ready", None)
    if future is None or binding_wait is None or getattr(binding_wait, _MARK, False):
        return
    main = threading.main_thread().ident
    get_ident = threading.get_ident

    def block_until_ready(self: Any) -> None:
        if get_ident() == main:
            binding_wait(self)
            return
        capi = self.capi
        if not capi.fdb_future_is_ready(self.fpointer):
            capi.fdb_future_block_until_ready(self.fpointer)

    setattr(block_until_ready, _MARK, True)
    block_until_ready.__doc__ = binding_wait.__doc__
    future.block_until_ready = block_until_ready
