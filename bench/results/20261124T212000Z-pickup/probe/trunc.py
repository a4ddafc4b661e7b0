import sys; MODE = sys.argv[1]
import sqlite3, time, os, tempfile
d = tempfile.mkdtemp(dir="/tmp")
p = os.path.join(d, "x.db")
c = sqlite3.connect(p, isolation_level=None)
c.execute("PRAGMA journal_mode=WAL"); c.execute("PRAGMA synchronous=NORMAL"); c.execute("PRAGMA wal_autocheckpoint=0")
c.execute("CREATE TABLE kv(key BLOB PRIMARY KEY, value BLOB) WITHOUT ROWID")
import random
for rnd in range(3):
    for i in range(1000):
        c.execute("BEGIN IMMEDIATE")
        for j in range(3):
            c.execute("INSERT OR REPLACE INTO kv VALUES (?, ?)", (os.urandom(16), os.urandom(100)))
        c.execute("COMMIT")
    print("wal MB", os.path.getsize(p + "-wal") / 1e6)
    t = time.time(); r = c.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone(); print("passive", r, round((time.time() - t) * 1000, 1), "ms")
    t = time.time(); r = c.execute("PRAGMA wal_checkpoint(RESTART)").fetchone(); print("restart right after passive", r, round((time.time() - t) * 1000, 1), "ms")
    for i in range(100):
        c.execute("BEGIN IMMEDIATE"); c.execute("INSERT OR REPLACE INTO kv VALUES (?, ?)", (os.urandom(16), os.urandom(100))); c.execute("COMMIT")
    t = time.time(); r = c.execute("PRAGMA wal_checkpoint(" + MODE + ")").fetchone(); print(MODE, r, round((time.time() - t) * 1000, 1), "ms")
