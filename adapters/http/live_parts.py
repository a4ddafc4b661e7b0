"""Live refresh that sends what changed (issue 43 point 3): a page is a set of named
parts (rendered HTML) laid out in named lists; its version is a short digest of each
part and of the layout, so a client that polls with the version it has gets a 304 when
nothing changed, or the layout and only the parts whose digest it does not hold.

Stateless: the server keeps nothing per client; a version it cannot read (hand-made,
truncated, of another page) is answered with every part, as a first load is."""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

_DIGEST = 6  # bytes a part's digest takes in a version: 48 bits, no collision in practice


def _digest(*texts: str) -> bytes:
    h = hashlib.blake2b(digest_size=_DIGEST)
    for text in texts:
        h.update(text.encode("utf-8"))
        h.update(b"\x00")
    return h.digest()


@dataclass(frozen=True, slots=True)
class LiveParts:
    """A page's parts (id -> HTML) and layout (list name -> part ids, in order)."""

    parts: Mapping[str, str]
    layout: Mapping[str, Sequence[str]]

    @property
    def version(self) -> str:
        """The digest of the layout, then of each part in id order, base64url."""
        packed = _digest(json.dumps(self.layout, sort_keys=True)) + b"".join(
            _digest(part_id, self.parts[part_id]) for part_id in sorted(self.parts)
        )
        return base64.urlsafe_b64encode(packed).rstrip(b"=").decode("ascii")

    def changed_since(self, version: str) -> dict[str, str] | None:
        """The parts a client holding ``version`` lacks; None when it is this version
        (nothing to send)."""
        if version == self.version:
            return None
        held = _digests(version)
        return {
            part_id: html
            for part_id, html in self.parts.items()
            if _digest(part_id, html) not in held
        }


def _digests(version: str) -> set[bytes]:
    try:
        packed = base64.urlsafe_b64decode(version + "=" * (-len(version) % 4))
    except (binascii.Error, ValueError):
        return set()
    if len(packed) % _DIGEST:
        return set()
    return {packed[i : i + _DIGEST] for i in range(_DIGEST, len(packed), _DIGEST)}
