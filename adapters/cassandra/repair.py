"""Give orphaned Cassandra zones their pointers back (``quick cassandra repair``).

The external-store enqueue writes the item to Cassandra, then commits the pointer
transaction. A producer that crashes between the two leaves an item that no pointer leads
to: it waits until the next enqueue into its zone creates the pointer. Repair lists the
zones in Cassandra and, for each non-empty zone without a pointer, creates one in the same
kind of transaction an enqueue would (reading the pointer index, declaring a write conflict
on it), so a pointer deletion racing the repair aborts one of the two, as it would an
enqueue.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from quickzones.adapters.cassandra.store import CassandraZoneStore
from quickzones.store.kv import KVTransaction, run
from quickzones.store.records import ZoneId


@dataclass
class RepairReport:
    """What a repair pass found: zones looked at, and those that had no pointer."""

    zones_checked: int = 0
    repaired: list[ZoneId] = field(default_factory=list)


def repair_pointers(
    store: CassandraZoneStore,
    zones: Iterable[ZoneId] | None = None,
    *,
    dry_run: bool = False,
) -> RepairReport:
    """Create the missing pointer of every non-empty zone in ``zones`` (default: every zone
    in the table). With ``dry_run`` the zones are reported, nothing is written."""
    report = RepairReport()
    toplevel = store.toplevel
    for zone in zones if zones is not None else store.zones():
        report.zones_checked += 1
        if toplevel.get_pointer(zone) is not None:
            continue
        vesting = store.min_vesting_ms(zone)
        if vesting is None:
            continue  # an empty partition: nothing waits
        if dry_run:
            report.repaired.append(zone)
            continue

        def create(tr: KVTransaction, zone: ZoneId = zone, vesting: int = vesting) -> bool:
            # False: this transaction created it (an enqueue may have beaten us to it).
            return toplevel.ensure_pointer(tr, zone, vesting, declare_conflict=True) is None

        if run(store.kv, create):
            report.repaired.append(zone)
    return report
