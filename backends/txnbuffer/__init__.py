"""Client-side transaction machinery shared by the memory and sqlite backends.

FoundationDB keeps a transaction's writes in the client until commit and overlays them on
every read (read-your-writes). This package is that client half, written once so every
backend built on it behaves the same (``docs/fdb-semantics.md`` sections 1-3):

* writes are buffered: point writes (set, clear, atomic op stacks, versionstamped values)
  in a sorted map, ``clear_range`` as a set of disjoint ranges, versionstamped keys as a
  list (their final key is known only at commit);
* ``get``/``get_range`` merge those writes over the storage snapshot at the read version;
  ``limit``/``reverse`` act on the merged view;
* read conflict ranges are recorded exactly as FDB's RYW layer does: ``get`` adds
  ``[k, k+\\x00)``; a forward range stopped by ``limit`` adds ``[begin, keyAfter(last))``,
  a reverse one ``[smallest returned, end)``; ranges this transaction already set or
  cleared add nothing, keys with a pending atomic op do; snapshot reads add none;
* size limits and the retry backoff (the atomic-op rules are in ``_atomics``, versionstamp
  templates in ``_versionstamps``, range algebra in ``_ranges``).

One module each: the argument checks and error codes (``checks``), the buffered writes
(``buffer``), what a commit hands the backend (``commit_request``), the transaction's
state and its storage half (``state``), conflict ranges (``conflicts``), reads
(``reads``), writes (``writes``), versions, commit and retry (``transaction``), and the
pooled connection a SQLite or PostgreSQL transaction holds while it reads (``pooled``).

A backend subclasses :class:`BufferedTransaction` and supplies the storage half: take a
read snapshot, read a key or a range at it, and commit a :class:`CommitRequest` (conflict
check, 1007 check, apply). :meth:`CommitRequest.resolve` turns the buffer into final
writes against the committed state, so atomic ops are evaluated at the commit version.
"""

from quickzones.backends.txnbuffer.buffer import KeyValue
from quickzones.backends.txnbuffer.checks import INTERNAL_ERROR
from quickzones.backends.txnbuffer.commit_request import CommitRequest, ResolvedWrites
from quickzones.backends.txnbuffer.transaction import VERSIONS_PER_SECOND, BufferedTransaction

__all__ = [
    "INTERNAL_ERROR",
    "VERSIONS_PER_SECOND",
    "BufferedTransaction",
    "CommitRequest",
    "KeyValue",
    "ResolvedWrites",
]
