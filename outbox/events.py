"""Building CloudEvents and encoding them into Kafka binary-mode messages.

Events are ``cloudevents.core.v1.event.CloudEvent`` objects from the CloudEvents 2.x SDK. The
encoding happens when an event is added to the outbox, so a bad event fails in the caller's
transaction, before commit, and the relay only copies bytes.
"""

from __future__ import annotations

import base64
import json
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from cloudevents.core.bindings.kafka import to_binary
from cloudevents.core.exceptions import BaseCloudEventException
from cloudevents.core.formats.json import JSONFormat
from cloudevents.core.v1.event import CloudEvent
from outboxkit.outbox.errors import InvalidEventError
from pydantic import BaseModel
from uuid_utils import uuid7

JSON_CONTENT_TYPE = "application/json"
BYTES_CONTENT_TYPE = "application/octet-stream"
TEXT_CONTENT_TYPE = "text/plain; charset=utf-8"
PARTITIONKEY = "partitionkey"

_JSON_CONTENT_TYPE = re.compile(r"^(application|text)/([a-zA-Z0-9.+-]+\+)?json(;.*)?$")
_EXTENSION_NAME = re.compile(r"^[a-z0-9]{1,20}$")
_FORMAT = JSONFormat()
_INT32 = range(-(2**31), 2**31)

EventData = BaseModel | dict[str, Any] | list[Any] | bytes | str | None


def new_event_id() -> str:
    """Return a new time-ordered event id (UUIDv7), so ids sort roughly by creation time."""
    return str(uuid7())


def new_event(
    type: str,
    source: str,
    data: EventData = None,
    *,
    id: str | None = None,
    subject: str | None = None,
    time: datetime | None = None,
    datacontenttype: str | None = None,
    dataschema: str | None = None,
    partitionkey: str | None = None,
    extensions: dict[str, str | int | bool] | None = None,
) -> CloudEvent:
    """Build a CloudEvents 1.0 event, validated now rather than when it is published.

    ``data`` may be a pydantic model or a dict/list (JSON), ``bytes`` or ``str``, or ``None``
    for an event without data. ``datacontenttype`` defaults to ``application/json``,
    ``application/octet-stream`` for bytes and ``text/plain; charset=utf-8`` for a str; an
    event without data has none (there is no data to describe), and is published as a Kafka
    record with a null value. ``id`` defaults to a UUIDv7; give a deterministic id to make
    publishing idempotent, since the outbox keeps one row per ``(source, id)``. ``time``
    defaults to now. ``partitionkey`` becomes the Kafka key: events that share it are published
    in the order they were written.
    """
    if not type or not isinstance(type, str):
        raise InvalidEventError("event 'type' is required and must be a non-empty string")
    if not source or not isinstance(source, str):
        raise InvalidEventError("event 'source' is required and must be a non-empty string")
    if isinstance(data, BaseModel):
        data = data.model_dump(mode="json")
    if datacontenttype is None and data is not None:
        datacontenttype = _default_content_type(data)
    attributes: dict[str, Any] = {
        "type": type,
        "source": source,
        "id": id if id is not None else new_event_id(),
    }
    if datacontenttype is not None:
        attributes["datacontenttype"] = datacontenttype
    optional: tuple[tuple[str, str | datetime | None], ...] = (
        ("subject", subject),
        ("time", time),
        ("dataschema", dataschema),
    )
    for name, optional_value in optional:
        if optional_value is not None:
            attributes[name] = optional_value
    all_extensions: dict[str, str | int | bool] = dict(extensions or {})
    if partitionkey is not None:
        all_extensions[PARTITIONKEY] = partitionkey
    for name, extension in all_extensions.items():
        if not isinstance(name, str) or not _EXTENSION_NAME.match(name):
            raise InvalidEventError(
                f"extension name {name!r} is invalid: use 1-20 lowercase letters or digits"
            )
        if name in attributes or name in ("specversion", "data", "data_base64"):
            raise InvalidEventError(f"extension {name!r} clashes with a CloudEvents attribute")
        if not isinstance(extension, str | int | bool) or extension == "":
            raise InvalidEventError(f"extension {name!r} must be a non-empty str, int or bool")
        is_integer = isinstance(extension, int) and not isinstance(extension, bool)
        if is_integer and extension not in _INT32:
            raise InvalidEventError(f"extension {name!r} is outside the 32-bit Integer range")
        attributes[name] = extension
    try:
        # The SDK serialises any JSON value; its annotation leaves out top-level arrays.
        return CloudEvent(attributes, data)  # type: ignore[arg-type]
    except BaseCloudEventException as error:
        raise InvalidEventError(f"invalid CloudEvent: {error}") from error


def _default_content_type(data: EventData) -> str:
    if isinstance(data, bytes):
        return BYTES_CONTENT_TYPE
    if isinstance(data, str):
        return TEXT_CONTENT_TYPE
    return JSON_CONTENT_TYPE


@dataclass(frozen=True, slots=True)
class EncodedEvent:
    """A CloudEvent in Kafka binary content mode: what one outbox row holds.

    An empty ``payload`` is an event without data: the relay publishes it as a record whose
    value is null (Kafka binding 3.2.2), as most readers (the Java SDK's too) cannot tell
    zero bytes of data from none.
    """

    source: str
    id: str
    type: str
    key: bytes | None
    headers: dict[str, str]
    payload: bytes


def encode_binary(event: CloudEvent) -> EncodedEvent:
    """Encode ``event`` for Kafka binary mode (``ce_`` headers, ``content-type``, key, value).

    Raises :class:`InvalidEventError` when the data cannot be serialised for its content type.
    """
    attributes = event.get_attributes()
    payload = _encode_data(event.get_data(), attributes.get("datacontenttype"))
    message = to_binary(CloudEvent(dict(attributes), payload), _FORMAT)
    headers = {name: value.decode("utf-8") for name, value in message.headers.items()}
    for name, value in attributes.items():
        # The SDK writes Python's True/False; the CloudEvents type system says true/false.
        if isinstance(value, bool):
            headers[f"ce_{name}"] = "true" if value else "false"
        # A Binary attribute's string form is base64 (CloudEvents type system), not repr().
        elif isinstance(value, bytes | bytearray):
            headers[f"ce_{name}"] = base64.b64encode(bytes(value)).decode("ascii")
    key = message.key.encode("utf-8") if isinstance(message.key, str) else message.key
    return EncodedEvent(
        source=event.get_source(),
        id=event.get_id(),
        type=event.get_type(),
        key=key,
        headers=headers,
        payload=payload,
    )


def _encode_data(data: Any, content_type: str | None) -> bytes:
    if data is None:
        return b""
    if isinstance(data, bytes | bytearray):
        return bytes(data)
    if isinstance(data, str) and not _is_json(content_type):
        return data.encode("utf-8")
    if not _is_json(content_type):
        raise InvalidEventError(
            f"data of type {type(data).__name__} needs a JSON content type, not {content_type!r}"
        )
    try:
        return json.dumps(data, separators=(",", ":"), allow_nan=False).encode("utf-8")
    except (TypeError, ValueError) as error:
        raise InvalidEventError(f"event data is not JSON-serialisable: {error}") from error


def _is_json(content_type: str | None) -> bool:
    return content_type is None or bool(_JSON_CONTENT_TYPE.match(content_type))
