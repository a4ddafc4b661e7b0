"""The store: the KV seam, the key layout, queue zones (paper section 5), the top-level
queue of pointers and its garbage collection (section 6), the two-part enqueue, outcome
records, limits and dead letters. Everything a consumer reads or writes goes through here."""
