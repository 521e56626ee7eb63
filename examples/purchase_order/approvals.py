"""The approver's side: an approval (or refusal) of the preview a workflow waits on, signed.

An approval is a CloudEvent from the ``approvals`` source addressed to one workflow
(``workflowid``, ``tenantid``), answering one wait (``correlationid``, shown in the wait's
history record), bound to the hash of the preview the approver saw (``requesthash``), and
signed with the source's HMAC key (``authsig``). Sent to the engine's signals topic, it goes
through the inbox, so a redelivery is applied once.
"""

from __future__ import annotations

from typing import Any

from cloudevents.core.v1.event import CloudEvent
from outboxkit.outbox import new_event
from outboxkit.workflows import request_hash, sign

from examples.purchase_order.definition import APPROVALS, GRANTED, REJECTED


def approval_event(
    key: bytes,
    *,
    tenant: str,
    workflow_id: str,
    correlation: str,
    preview: Any,
    by: str,
    event_id: str,
    granted: bool = True,
    comment: str = "",
) -> CloudEvent:
    """The signed approval (``granted``) or refusal of ``preview`` by ``by``."""
    kind = GRANTED if granted else REJECTED
    extensions: dict[str, str | int | bool] = {
        "workflowid": workflow_id,
        "tenantid": tenant,
        "correlationid": correlation,
        "requesthash": request_hash(preview),
    }
    data = {"by": by, "comment": comment}
    extensions["authsig"] = sign(
        key, source=APPROVALS, id=event_id, type=kind, extensions=extensions, data=data
    )
    return new_event(
        kind,
        APPROVALS,
        data,
        id=event_id,
        subject=workflow_id,
        partitionkey=workflow_id,
        extensions=extensions,
    )
