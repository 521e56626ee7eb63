"""Authenticating the events that resume a workflow: HMAC-SHA256 per source.

The sender signs what identifies and correlates the event, plus a hash of its data; the
signature travels in the ``authsig`` extension. A verifier holds each allowed source's keys (a
list, so a key can be rotated: sign with the new one while both are accepted, then drop the
old); removing a source's keys revokes it. Any object with ``verify(event) -> principal | None``
can stand in for :class:`HmacVerifier` (mTLS identities, a JWT check...).
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from cloudevents.core.base import BaseCloudEvent
from outboxkit.actions.hashing import canonical_json

SIGNATURE_EXTENSION = "authsig"
WORKFLOW_EXTENSION = "workflowid"
TENANT_EXTENSION = "tenantid"
CORRELATION_EXTENSION = "correlationid"
REQUEST_HASH_EXTENSION = "requesthash"
_SIGNED = (WORKFLOW_EXTENSION, TENANT_EXTENSION, CORRELATION_EXTENSION, REQUEST_HASH_EXTENSION)


class SignalVerifier(Protocol):
    """Authenticates a signal; returns who sent it (the principal), or ``None`` to refuse it."""

    def verify(self, event: BaseCloudEvent) -> str | None:
        """The authenticated principal of ``event``, or ``None``."""
        ...


def signed_material(
    *, source: str, id: str, type: str, extensions: Mapping[str, Any], data: Any
) -> bytes:
    """The bytes a signature covers: identity, routing extensions and the data's hash."""
    data_hash = hashlib.sha256(canonical_json(data).encode("utf-8")).hexdigest()
    parts = [source, id, type, *(str(extensions.get(name) or "") for name in _SIGNED), data_hash]
    return canonical_json(parts).encode("utf-8")


def sign(
    key: bytes, *, source: str, id: str, type: str, extensions: Mapping[str, Any], data: Any
) -> str:
    """The ``authsig`` value for an event with these attributes, signed with ``key``."""
    material = signed_material(source=source, id=id, type=type, extensions=extensions, data=data)
    return hmac.new(key, material, hashlib.sha256).hexdigest()


class HmacVerifier:
    """Accepts an event whose ``authsig`` matches one of its source's keys.

    ``keys`` maps each allowed source to its keys; the principal is the source. An event from a
    source without keys is refused.
    """

    def __init__(self, keys: Mapping[str, bytes | Sequence[bytes]]) -> None:
        self._keys = {
            source: [value] if isinstance(value, bytes) else list(value)
            for source, value in keys.items()
        }

    def verify(self, event: BaseCloudEvent) -> str | None:
        """The event's source if its signature matches one of that source's keys."""
        keys = self._keys.get(event.get_source())
        return event.get_source() if keys and signed_with(event, keys) else None


def signed_with(event: BaseCloudEvent, keys: Sequence[bytes]) -> bool:
    """Whether ``event``'s ``authsig`` is the signature of its attributes by one of ``keys``."""
    signature = event.get_extension(SIGNATURE_EXTENSION)
    if not isinstance(signature, str):
        return False
    extensions = {name: event.get_extension(name) for name in _SIGNED}
    material = signed_material(
        source=event.get_source(),
        id=event.get_id(),
        type=event.get_type(),
        extensions=extensions,
        data=event_data(event),
    )
    return any(
        hmac.compare_digest(hmac.new(key, material, hashlib.sha256).hexdigest(), signature)
        for key in keys
    )


def event_data(event: BaseCloudEvent) -> Any:
    """The event's data as JSON values (bytes of JSON parsed, other bytes as text)."""
    data = event.get_data()
    if isinstance(data, bytes | bytearray):
        try:
            return json.loads(data)
        except ValueError:
            return data.decode("utf-8", "replace")
    return data
