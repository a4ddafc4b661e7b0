"""The simulation's invariant checker: cheap checks after every step, and a full scan
of the committed store state every ``check_every`` steps and at quiescence."""

from __future__ import annotations

from quickzones.clock import now_ms
from quickzones.store.kv import unpack_i64
from quickzones.store.records import ZoneId, decode_pointer
from quickzones.store.tuple_layer import fdbtuple
from quickzones.testing.simulation.model import ABSENT, AMO, COMMITTED, PLAIN, TTL, TX, effect_key
from quickzones.testing.simulation.world import SimWorld


class InvariantChecks(SimWorld):
    """Compares the model with the store and reports what disagrees."""

    def check_step(self) -> None:
        """Cheap checks after every step."""
        leaders = [sc.consumer.name for sc in self.consumers if sc.consumer.in_order]
        if len(leaders) > 1:
            self._violate("two_in_order_scanners", ",".join(leaders))

    def check_store(self, *, final: bool = False) -> int:
        """Full scan of the committed state; returns the number of lost items."""
        snap = self.store.snapshot_items()
        now = now_ms(self.clock)
        zp, cp = self._z_prefix, self._c_prefix
        zone_items: dict[ZoneId, dict[str, bytes]] = {}
        order: dict[ZoneId, set[tuple[int, tuple[object, ...], str]]] = {}
        counts: dict[ZoneId, int] = {}
        pointers: dict[tuple[int, str], tuple[ZoneId, int]] = {}
        vest_entries: list[tuple[int, int, str]] = []
        index: dict[ZoneId, tuple[int, str]] = {}
        for key, value in snap.items():
            if key.startswith(zp):
                parts = fdbtuple.unpack(key[len(zp) :])
                zone = ZoneId(parts[0], parts[1])
                tag = parts[2]
                if tag == "i" and len(parts) == 4:
                    zone_items.setdefault(zone, {})[parts[3]] = value
                elif tag == "x":
                    order.setdefault(zone, set()).add(_order_entry(parts[3:]))
                elif tag == "n":  # the count or a shard of it (sharded_counts)
                    counts[zone] = counts.get(zone, 0) + unpack_i64(value)
            elif key.startswith(cp):
                parts = fdbtuple.unpack(key[len(cp) :])
                shard, tag = parts[0], parts[1]
                if tag == "p":
                    p = decode_pointer(key, value)
                    pointers[(shard, p.pointer_id)] = (p.zone, p.vesting_ms)
                elif tag == "v":
                    vest_entries.append((shard, parts[2], parts[3]))
                elif tag == "ix":
                    index[ZoneId(parts[2], parts[3])] = (shard, value.decode())
        self._check_structure(zone_items, order, counts, pointers, vest_entries, index)
        self._check_starvation(vest_entries, now)
        lost = self._check_items(snap, zone_items, final=final)
        for txn in self.txns:
            if (txn.key in snap) != txn.committed:
                self._violate(
                    "user_txn_state",
                    f"{txn.key!r} exists={txn.key in snap} but committed={txn.committed}",
                )
        return lost

    def _check_structure(
        self,
        zone_items: dict[ZoneId, dict[str, bytes]],
        order: dict[ZoneId, set[tuple[int, tuple[object, ...], str]]],
        counts: dict[ZoneId, int],
        pointers: dict[tuple[int, str], tuple[ZoneId, int]],
        vest_entries: list[tuple[int, int, str]],
        index: dict[ZoneId, tuple[int, str]],
    ) -> None:
        from quickzones.store.records import decode_item

        for zone in sorted(set(zone_items) | set(order) | set(counts)):
            items = zone_items.get(zone, {})
            n = counts.get(zone, 0)
            if n != len(items):
                self._violate("zone_count", f"{zone}: count key {n}, {len(items)} items")
            expected: set[tuple[int, tuple[object, ...], str]] = set()
            for item_id, raw in items.items():
                rec = decode_item(b"", raw)
                if rec.commit_order is None:
                    expected.add((rec.priority, ("vesting", rec.vesting_ms), item_id))
                else:
                    expected.add((rec.priority, ("commit", *rec.commit_order), item_id))
            got = order.get(zone, set())
            if got != expected:
                missing, extra = sorted(expected - got)[:3], sorted(got - expected)[:3]
                self._violate("order_index", f"{zone}: missing {missing} extra {extra}")
            if items:
                # Invariant 1: a non-empty zone has a pointer in its top-level queue.
                entry = index.get(zone)
                if entry is None:
                    self._violate("zone_without_pointer", f"{zone}: {sorted(items)[:3]}")
                elif entry not in pointers:
                    self._violate("pointer_index_dangling", f"{zone} -> {entry}")
        for (shard, pid), (zone, _) in pointers.items():
            if index.get(zone) != (shard, pid):
                self._violate(
                    "pointer_not_indexed", f"{zone} pointer {pid} index {index.get(zone)}"
                )
        seen: dict[tuple[int, str], int] = {}
        for shard, vesting, pid in vest_entries:
            p = pointers.get((shard, pid))
            if p is None or p[1] != vesting:
                self._violate("vesting_entry_stale", f"pointer {pid} entry at {vesting}")
            seen[(shard, pid)] = seen.get((shard, pid), 0) + 1
        for key in pointers:
            if seen.get(key, 0) != 1:
                self._violate("pointer_vesting_entries", f"pointer {key[1]}: {seen.get(key, 0)}")

    def _check_starvation(self, vest_entries: list[tuple[int, int, str]], now: int) -> None:
        """Invariant 10: with an in-order scanner running, a vested pointer is leased within
        a bound of virtual time and of in-order scan rounds."""
        t, rounds = self.clock.now(), self.in_order_rounds
        current: dict[tuple[str, int], tuple[float, int]] = {}
        for _, vesting, pid in vest_entries:
            if vesting > now:
                continue
            key = (pid, vesting)
            first = self.vested_seen.get(key, (t, rounds))
            current[key] = first
            since_t, since_r = first
            leased = self.pointer_leased.get(pid)
            if leased is not None and leased[0] > since_t:
                since_t, since_r = leased
            if t - since_t > self.cfg.starvation_bound_s and rounds - since_r >= (
                self.cfg.starvation_rounds
            ):
                self._violate(
                    "vested_pointer_starved",
                    f"pointer {pid} vested at {vesting} unvisited for {t - since_t:.1f}s "
                    f"and {rounds - since_r} in-order rounds",
                    about=pid,
                )
        self.vested_seen = current

    def _check_items(
        self, snap: dict[bytes, bytes], zone_items: dict[ZoneId, dict[str, bytes]], *, final: bool
    ) -> int:
        lost = 0
        for m in self.items.values():
            present = m.item_id in zone_items.get(m.zone, {})
            dead = m.dead_key in snap
            effect = unpack_i64(snap.get(effect_key(m.item_id))) if m.kind == TX else 0
            if m.state == ABSENT:
                if present or dead or effect or m.deliveries:
                    self._violate("aborted_item_exists", f"{m.item_id} {m.zone}")
                continue
            if effect > 1:
                self._violate("tx_effect_twice", f"{m.item_id}: effect {effect}")
            if m.kind == TX and effect == 1 and (present or dead):
                self._violate(
                    "tx_effect_without_completion", f"{m.item_id} present={present} dead={dead}"
                )
            if m.completed_event and present and m.kind != AMO:
                self._violate("completed_item_present", m.item_id)
            if m.kind == AMO and present and m.deliveries:
                self._violate("at_most_once_delivered_but_present", m.item_id)
            if m.state != COMMITTED or present or dead:
                if final and present and m.state == COMMITTED:
                    self._violate("item_stuck", f"{m.item_id} in {m.zone} after draining")
                continue
            if (m.kind in (PLAIN, TTL) and m.successes == 0) or (m.kind == TX and effect != 1):
                lost += 1
                self._violate(
                    "item_lost",
                    f"{m.kind} {m.item_id} in {m.zone}: gone, not dead-lettered, never "
                    f"completed (runs {m.deliveries})",
                    about=m.item_id,
                )
        return lost


def _order_entry(parts: tuple[object, ...]) -> tuple[int, tuple[object, ...], str]:
    """An order key's tail, (priority, vesting, id) or (priority, stamp, seq, id), in the
    shape the checker compares with what the item's record says."""
    priority, item_id = parts[0], parts[-1]
    assert isinstance(priority, int) and isinstance(item_id, str)
    if len(parts) == 3:
        return priority, ("vesting", parts[1]), item_id
    stamp = parts[1]
    assert isinstance(stamp, fdbtuple.Versionstamp)
    return priority, ("commit", stamp.tr_version, parts[2]), item_id
