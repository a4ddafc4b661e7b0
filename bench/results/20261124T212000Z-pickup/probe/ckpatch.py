import time
from quickzones.backends.sqlite import store as _st
CK = []
_orig_bw = _st.SQLiteStore._bound_wal
def _bw(self, conn):
    import os
    try: size = os.path.getsize(self.path + "-wal")
    except OSError: size = -1
    t = time.time(); _orig_bw(self, conn); dt = time.time() - t
    if dt > 0.001: CK.append((t, dt, "truncate", size))
_st.SQLiteStore._bound_wal = _bw
from quickzones.backends.sqlite import checkpointer as _ckm
import sqlite3
class _Conn:
    def __init__(self, c): self._c = c
    def execute(self, sql, *a):
        t = time.time(); r = self._c.execute(sql, *a)
        if "PASSIVE" in sql:
            r = r.fetchall(); dt = time.time() - t; CK.append((t, dt, "passive", r[0] if r else None)); return _R(r)
        return r
    def __getattr__(self, n): return getattr(self._c, n)
class _R:
    def __init__(self, r): self.r = r
    def fetchone(self): return self.r[0] if self.r else None
_orig_init = _ckm.Checkpointer.__init__
def _init(self, connect, **k):
    _orig_init(self, lambda: _Conn(connect()), **k)
_ckm.Checkpointer.__init__ = _init
_orig_co = _st.SQLiteStore._commit_on
def _co(self, conn, request):
    t = time.time(); c = time.thread_time()
    try:
        return _orig_co(self, conn, request)
    finally:
        dt = time.time() - t
        if dt > 0.003: CK.append((t, dt, "commit_on", round((time.thread_time() - c) * 1000, 1)))
_st.SQLiteStore._commit_on = _co
def _record_slow(cls, name, kind):
    """Wrap cls.name: record (start, seconds, kind) of each call over 3 ms in CK."""
    orig = getattr(cls, name)
    def timed(self, *a, **k):
        t = time.time()
        try:
            return orig(self, *a, **k)
        finally:
            dt = time.time() - t
            if dt > 0.003: CK.append((t, dt, kind, None))
    setattr(cls, name, timed)
_record_slow(_st.SQLiteTransaction, "_read_range", "read_range")
_record_slow(_st.SQLiteTransaction, "_acquire_read_version", "read_version")
import threading as _th
_tl = _th.local()
HOLDS = []
_orig_bi2 = _st.SQLiteStore._begin_immediate
def _bi2(self, conn):
    _orig_bi2(self, conn); _tl.acq = time.time()
_st.SQLiteStore._begin_immediate = _bi2
_orig_co2 = _st.SQLiteStore._commit_on
def _co2(self, conn, request):
    try:
        return _orig_co2(self, conn, request)
    finally:
        a = getattr(_tl, "acq", None)
        if a:
            HOLDS.append((a, time.time() - a, len(request._points), _th.current_thread().name)); _tl.acq = None
_st.SQLiteStore._commit_on = _co2
