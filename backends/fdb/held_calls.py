"""libfdb_c calls that return at once, made without letting go of the GIL.

The binding calls libfdb_c through a ``ctypes.CDLL``, and ctypes drops the GIL around
every foreign call and takes it back after. In a consumer process a dozen threads
(managers, workers, the scanner, the completer) want the GIL, so taking it back after a
call that took a microsecond is a hand-off through the interpreter's GIL wait: a futex
wake and sleep, and often a switch to another thread first. A drained item makes some 30
such calls (a write, a read's future, its value, its destroy...), and on a two-core host
that hand-off, not libfdb_c, was most of what those calls cost (issue 44 point 5).

Here the calls that only hand work to the client's network thread or read a ready future
go through a ``ctypes.PyDLL`` of the same library instead, which keeps the GIL for the
call. None of them waits for the network thread nor runs a Python callback, so holding
the GIL cannot stall the network thread (it takes the GIL only to run a callback, and
then after the call returned). The calls that may wait (``fdb_future_block_until_ready``,
:mod:`.waits`) or run a callback (``fdb_future_set_callback``, which runs it at once on a
ready future) keep the binding's CDLL, as do the network's own start and stop.
"""

from __future__ import annotations

import ctypes
from typing import Any

_MARK = "_quick_held_calls"

# Calls that post to the network thread or read a ready future, and return.
HELD = (
    "fdb_database_create_transaction",
    "fdb_transaction_destroy",
    "fdb_transaction_set_option",
    "fdb_transaction_get_read_version",
    "fdb_transaction_get",
    "fdb_transaction_get_range",
    "fdb_transaction_set",
    "fdb_transaction_clear",
    "fdb_transaction_clear_range",
    "fdb_transaction_atomic_op",
    "fdb_transaction_add_conflict_range",
    "fdb_transaction_commit",
    "fdb_transaction_get_committed_version",
    "fdb_transaction_get_versionstamp",
    "fdb_future_is_ready",
    "fdb_future_destroy",
    "fdb_future_get_error",
    "fdb_future_get_int64",
    "fdb_future_get_key",
    "fdb_future_get_value",
    "fdb_future_get_keyvalue_array",
)


def install(fdb: Any) -> None:
    """Route :data:`HELD` through a PyDLL of ``fdb``'s libfdb_c, with the binding's own
    argument types, result type and error check; once per process. A binding without
    ``fdb.impl._capi`` (the simulator standing in for it) is left as it is."""
    capi: Any = getattr(getattr(fdb, "impl", None), "_capi", None)
    if not isinstance(capi, ctypes.CDLL) or getattr(capi, _MARK, False):
        return
    held = ctypes.PyDLL(capi._name, handle=capi._handle)
    for name in HELD:
        binding_fn = getattr(capi, name, None)
        if binding_fn is None:
            continue
        fn = getattr(held, name)
        fn.argtypes = binding_fn.argtypes
        fn.restype = binding_fn.restype
        if getattr(binding_fn, "errcheck", None) is not None:
            fn.errcheck = binding_fn.errcheck
        setattr(capi, name, fn)
    setattr(capi, _MARK, True)
