"""``POST /v1/leases/cancelled``: which of a pull consumer's leased items were cancelled
(or otherwise went: completed elsewhere, dead-lettered) while it runs them.

A remote worker asks once for all its running items, every half second, so a handler
sees ``ctx.cancelled`` within about a second instead of at the next lease extension (a
third of the lease; issue 27, point 1.6). One read per item, no write: the answer is what
the store held when it was read.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from pydantic import BaseModel, Field

from quickzones.adapters.http import models as m
from quickzones.adapters.http.api import Consumer, allow_app, state_of
from quickzones.consumer.settler import UNRUN
from quickzones.store.validation import check_name

router = APIRouter(prefix="/v1")


class CancelledAnswer(BaseModel):
    cancelled: list[bool] = Field(
        description="one per item, in request order: true when the item is no longer "
        "stored (cancelled, completed elsewhere or dead-lettered): stop running it"
    )


@router.post("/leases/cancelled", tags=["consume"], response_model=CancelledAnswer)
def cancelled(body: m.CompleteManyRequest, request: Request, who: Consumer) -> CancelledAnswer:
    """Which of these leased items are gone; the token must allow every item's app."""
    state = state_of(request)
    q = state.q
    answer = []
    for item in body.items:
        zone = q.zone(allow_app(who, item.app), item.tenant)
        gone = q.items.get(zone, check_name("item_id", item.item_id)) is None
        if gone:  # its run ends here: the server's heartbeat stops listing it,
            state.leaser.ended(zone, item.item_id, UNRUN)  # and its slots are freed
        answer.append(gone)
    return CancelledAnswer(cancelled=answer)
