"""Turning a Kafka record into a CloudEvent, or into a permanent error that says why not.

This follows the CloudEvents Kafka protocol binding (``kafka-protocol-binding.md``) and the
JSON event format, not the Python SDK's readers, which differ from them in ways that matter:

- The content mode is structured when the ``content-type`` header starts with
  ``application/cloudevents``, binary otherwise (the SDK's ``from_kafka`` looks for any ``ce_``
  header instead, which misreads structured records that carry one).
- The Kafka key is never an attribute (binding 3.1: a key mapping must not modify the event).
  The SDK's readers copy it into ``partitionkey``, overwriting the one the producer sent or
  adding one it did not; here ``partitionkey`` comes from its ``ce_`` header (binary) or from
  the JSON envelope (structured) only. Handlers that need the key take a ``KafkaRecord``.
- An attribute the producer did not send does not appear: the SDK's constructor invents ``id``
  (refused here: it is required) and ``time`` (removed again here: it is optional).
- A null or empty value is an event without data (binding 3.2.2; the Java SDK reads it so too).
- Data of a JSON content type (or of none) must be valid JSON (the SDK silently returns a string
  otherwise). The Python type of data depends on its content type only, the same in both modes:
  JSON is parsed, ``text/*`` is ``str`` (``bytes`` if it is not UTF-8), anything else ``bytes``.
"""

from __future__ import annotations

import base64
import binascii
import functools
import json
import re
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from cloudevents.core.exceptions import BaseCloudEventException
from cloudevents.core.v1.event import CloudEvent
from dateutil.parser import isoparse
from outboxkit.consumers.tables import EVENT_ID_MAX, SOURCE_MAX
from outboxkit.outbox.errors import PermanentError

CE_PREFIX = "ce_"
CONTENT_TYPE = "content-type"
STRUCTURED_PREFIX = "application/cloudevents"
STRUCTURED_JSON = "application/cloudevents+json"
REQUIRED = ("specversion", "id", "source", "type")
# Context attributes whose type is String, URI, URI-reference or URI-template: JSON strings.
STRING_ATTRIBUTES = frozenset({*REQUIRED, "datacontenttype", "dataschema", "subject"})
_REQUIRED_HEADERS = tuple(CE_PREFIX + name for name in REQUIRED)
SPECVERSION = "1.0"
TIME = "time"

_JSON_CONTENT_TYPE = re.compile(r"^(application|text)/([a-zA-Z0-9.+-]+\+)?json(;.*)?$")
_INT32 = range(-(2**31), 2**31)

Headers = Sequence[tuple[str, bytes | None]]


class DecodeError(PermanentError):
    """The record cannot become a CloudEvent; retrying cannot help."""


class NotACloudEventError(DecodeError):
    """Neither a structured-mode content type nor any ``ce_`` header."""


class MissingAttributesError(DecodeError):
    """A required CloudEvents attribute (specversion, id, source, type) is absent or empty."""


class InvalidAttributeError(DecodeError):
    """An attribute or header is present but not valid (encoding, type, time, name, size)."""


class InvalidJSONError(DecodeError):
    """The data, or a structured-mode record, is not valid JSON although its type says JSON."""


class UnsupportedFormatError(DecodeError):
    """A structured-mode event format other than JSON."""


@functools.lru_cache(maxsize=256)
def is_json_content_type(content_type: str | None) -> bool:
    """Whether data of this content type is JSON (no content type counts as JSON)."""
    return content_type is None or bool(_JSON_CONTENT_TYPE.match(content_type.strip()))


def decode_record(headers: Headers, value: bytes | None) -> CloudEvent:
    """Decode a Kafka record's headers and value into a CloudEvents 1.0 event.

    The record's key is not part of the event (see the module's notes). Raises a
    :class:`DecodeError` subclass, whose message never quotes the payload.
    """
    relevant = _relevant_headers(headers)
    content_type = relevant.get(CONTENT_TYPE)
    if content_type is not None and content_type.strip().lower().startswith(STRUCTURED_PREFIX):
        event = _decode_structured(content_type, value or b"")
    else:
        event = _decode_binary(relevant, value, content_type)
    _check_sizes(event)
    return event


def _relevant_headers(headers: Headers) -> dict[str, str]:
    # Only ce_* and content-type matter; other headers (tracing, the producer's own) may hold
    # anything, including bytes that are not UTF-8, and must not break decoding.
    relevant: dict[str, str] = {}
    for raw_name, raw_value in headers:
        name = raw_name.lower()
        if not (name.startswith(CE_PREFIX) or name == CONTENT_TYPE):
            continue
        if name in relevant:
            raise InvalidAttributeError(f"header {name!r} appears more than once")
        try:
            relevant[name] = (raw_value or b"").decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidAttributeError(f"header {name!r} is not valid UTF-8") from None
    return relevant


def _decode_binary(
    headers: dict[str, str], value: bytes | None, content_type: str | None
) -> CloudEvent:
    """Binary mode: each ``ce_`` header is an attribute (its value a string, ``time`` parsed),
    ``content-type`` is ``datacontenttype``, the value is the data."""
    if not all(headers.get(name) for name in _REQUIRED_HEADERS):
        if not any(name.startswith(CE_PREFIX) for name in headers):
            raise NotACloudEventError(
                "no ce_ headers and no application/cloudevents content-type: not a CloudEvent"
            )
        missing = [name for name in REQUIRED if not headers.get(CE_PREFIX + name)]
        raise MissingAttributesError(f"missing CloudEvents attribute(s): {', '.join(missing)}")
    if headers[CE_PREFIX + "specversion"] != SPECVERSION:
        raise InvalidAttributeError("unsupported specversion: only 1.0 is accepted")
    attributes: dict[str, Any] = {}
    for name, text in headers.items():
        if name.startswith(CE_PREFIX):
            attribute = name[len(CE_PREFIX) :]
            attributes[attribute] = _parse_time(text) if attribute == TIME else text
        elif name == CONTENT_TYPE:
            attributes["datacontenttype"] = text
    return _build(attributes, _data_from_bytes(value, content_type))


def _decode_structured(content_type: str, value: bytes) -> CloudEvent:
    """Structured mode, JSON event format: the envelope holds every attribute and the data."""
    media_type = content_type.split(";", 1)[0].strip().lower()
    if media_type != STRUCTURED_JSON:
        raise UnsupportedFormatError(f"unsupported structured event format {media_type!r}")
    document = _check_json(value, "structured event")
    if not isinstance(document, dict):
        raise InvalidJSONError("structured event is not a JSON object")
    # A member whose value is null is treated as an absent attribute.
    members = {name: member for name, member in document.items() if member is not None}
    missing = [
        name for name in REQUIRED if not isinstance(members.get(name), str) or not members[name]
    ]
    if missing:
        raise MissingAttributesError(f"missing CloudEvents attribute(s): {', '.join(missing)}")
    if members["specversion"] != SPECVERSION:
        raise InvalidAttributeError("unsupported specversion: only 1.0 is accepted")
    if "data" in members and "data_base64" in members:
        raise InvalidAttributeError("a structured event has both 'data' and 'data_base64'")
    data = members.pop("data", None)
    data_base64 = members.pop("data_base64", None)
    attributes = {name: _json_attribute(name, member) for name, member in members.items()}
    data_type = attributes.get("datacontenttype")
    if data_base64 is not None:
        data = _data_from_bytes(_base64(data_base64), data_type)
    elif data is not None and not is_json_content_type(data_type):
        # Non-JSON data travels as a JSON string: read it as the bytes it stands for, so its
        # Python type is the one binary mode gives for the same content type.
        if not isinstance(data, str):
            raise InvalidAttributeError("'data' of a non-JSON content type must be a string")
        data = _data_from_bytes(data.encode("utf-8"), data_type)
    return _build(attributes, data)


def _json_attribute(name: str, member: Any) -> Any:
    """An attribute of the JSON envelope, checked against the CloudEvents type system."""
    if name == TIME:
        if not isinstance(member, str):
            raise InvalidAttributeError("'time' must be a string (RFC 3339)")
        return _parse_time(member)
    if name in STRING_ATTRIBUTES:
        if not isinstance(member, str):
            raise InvalidAttributeError(f"attribute {name!r} must be a string")
        return member
    # Extensions: String, Boolean and Integer keep their JSON type; Binary, URI and Timestamp
    # values are strings in JSON and stay strings, as in binary mode.
    if isinstance(member, bool | str):
        return member
    if isinstance(member, int) and member in _INT32:
        return member
    raise InvalidAttributeError(f"extension {name!r} is not a string, boolean or 32-bit integer")


def _data_from_bytes(value: bytes | None, content_type: str | None) -> Any:
    if not value:
        return None
    if is_json_content_type(content_type):
        return _check_json(value, "data")
    if content_type is not None and content_type.strip().lower().startswith("text/"):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return bytes(value)
    return bytes(value)  # binary data stays bytes, whatever it happens to decode to


def _base64(text: Any) -> bytes:
    if not isinstance(text, str):
        raise InvalidAttributeError("'data_base64' must be a string")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidAttributeError("'data_base64' is not valid base64") from None


def _parse_time(text: str) -> datetime:
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        pass
    try:
        parsed: datetime = isoparse(text)  # the SDK's parser: RFC 3339 forms the stdlib refuses
    except (ValueError, OverflowError):
        raise InvalidAttributeError("'time' is not an RFC 3339 timestamp") from None
    return parsed


def _check_json(value: bytes, what: str) -> Any:
    try:
        return json.loads(value)
    except (ValueError, UnicodeDecodeError):
        raise InvalidJSONError(f"{what} is not valid JSON for its content type") from None
    except RecursionError:
        # Nesting deeper than the parser's recursion limit: as undecodable as a syntax error.
        raise InvalidJSONError(f"{what} is JSON nested too deeply to parse") from None


def _build(attributes: dict[str, Any], data: Any) -> CloudEvent:
    sent_time = TIME in attributes
    try:
        event = CloudEvent(attributes, data)
    except BaseCloudEventException as error:
        raise InvalidAttributeError(_attribute_problem(error)) from None
    except (ValueError, TypeError):
        raise InvalidAttributeError("an attribute has an invalid value") from None
    if not sent_time:
        # The SDK's constructor stamps an event without 'time' with the moment it was built;
        # 'time' is optional, and an attribute the producer did not send must not appear.
        event.get_attributes().pop(TIME, None)
    return event


def _attribute_problem(error: BaseCloudEventException) -> str:
    names = sorted(getattr(error, "errors", {}) or [])
    if names:
        return f"invalid CloudEvents attribute(s): {', '.join(names)}"[:300]
    return "invalid CloudEvents attributes"


def _check_sizes(event: CloudEvent) -> None:
    if len(event.get_source()) > SOURCE_MAX:
        raise InvalidAttributeError(f"'source' is longer than {SOURCE_MAX} characters")
    if len(event.get_id()) > EVENT_ID_MAX:
        raise InvalidAttributeError(f"'id' is longer than {EVENT_ID_MAX} characters")
