"""Turning a Kafka record into a CloudEvent, or into a permanent error that says why not.

The content mode is chosen as the CloudEvents Kafka binding says: structured when the
``content-type`` header starts with ``application/cloudevents``, binary otherwise (the SDK's
``from_kafka`` looks for any ``ce_`` header instead, which misreads structured records that
carry one). Required attributes are checked here, because the SDK's constructor would invent
a missing ``id``, and JSON data is parsed here, because the SDK's reader silently returns a
string when JSON is invalid.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from cloudevents.core.bindings.kafka import KafkaMessage, from_structured
from cloudevents.core.exceptions import BaseCloudEventException
from cloudevents.core.formats.json import JSONFormat
from cloudevents.core.v1.event import CloudEvent
from dateutil.parser import isoparse
from outboxkit.consumers.tables import EVENT_ID_MAX, SOURCE_MAX
from outboxkit.outbox.errors import PermanentError

CE_PREFIX = "ce_"
CONTENT_TYPE = "content-type"
STRUCTURED_PREFIX = "application/cloudevents"
STRUCTURED_JSON = "application/cloudevents+json"
REQUIRED = ("specversion", "id", "source", "type")
_REQUIRED_HEADERS = tuple(CE_PREFIX + name for name in REQUIRED)
SPECVERSION = "1.0"

_JSON_CONTENT_TYPE = re.compile(r"^(application|text)/([a-zA-Z0-9.+-]+\+)?json(;.*)?$")
_FORMAT = JSONFormat()

Headers = Sequence[tuple[str, bytes | None]]


class DecodeError(PermanentError):
    """The record cannot become a CloudEvent; retrying cannot help."""


class NotACloudEventError(DecodeError):
    """Neither a structured-mode content type nor any ``ce_`` header."""


class MissingAttributesError(DecodeError):
    """A required CloudEvents attribute (specversion, id, source, type) is absent or empty."""


class InvalidAttributeError(DecodeError):
    """An attribute or header is present but not valid (encoding, time, name, version, size)."""


class InvalidJSONError(DecodeError):
    """The data, or a structured-mode record, is not valid JSON although its type says JSON."""


class UnsupportedFormatError(DecodeError):
    """A structured-mode event format other than JSON."""


@functools.lru_cache(maxsize=256)
def is_json_content_type(content_type: str | None) -> bool:
    """Whether data of this content type is JSON (no content type counts as JSON)."""
    return content_type is None or bool(_JSON_CONTENT_TYPE.match(content_type.strip()))


def decode_record(headers: Headers, key: bytes | None, value: bytes | None) -> CloudEvent:
    """Decode a Kafka record's headers, key and value into a CloudEvents 1.0 event.

    Raises a :class:`DecodeError` subclass, whose message never quotes the payload.
    """
    relevant = _relevant_headers(headers)
    content_type = relevant.get(CONTENT_TYPE)
    if content_type is not None and content_type.strip().lower().startswith(STRUCTURED_PREFIX):
        message = KafkaMessage(
            headers={name: text.encode("utf-8") for name, text in relevant.items()},
            key=_key_text(key),
            value=value or b"",
        )
        event = _decode_structured(content_type, message)
    else:
        event = _decode_binary(relevant, _key_text(key), value or b"", content_type)
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


def _key_text(key: bytes | None) -> str | None:
    # The SDK turns the key into the 'partitionkey' extension; a binary key simply has none.
    if key is None:
        return None
    try:
        return key.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _decode_binary(
    headers: dict[str, str], key: str | None, value: bytes, content_type: str | None
) -> CloudEvent:
    """Binary mode, as the SDK's ``from_binary`` reads it, but parsing the data only once
    (and ``time`` with the standard library first, which is faster than dateutil)."""
    if not all(headers.get(name) for name in _REQUIRED_HEADERS):
        if not any(name.startswith(CE_PREFIX) for name in headers):
            raise NotACloudEventError(
                "no ce_ headers and no application/cloudevents content-type: not a CloudEvent"
            )
        missing = [name for name in REQUIRED if not headers.get(CE_PREFIX + name)]
        raise MissingAttributesError(f"missing CloudEvents attribute(s): {', '.join(missing)}")
    if headers[CE_PREFIX + "specversion"] != SPECVERSION:
        raise InvalidAttributeError("unsupported specversion: only 1.0 is accepted")
    data: Any = None
    if value and is_json_content_type(content_type):
        data = _check_json(value, "data")
    elif value and _is_text(content_type):
        try:
            data = value.decode("utf-8")
        except UnicodeDecodeError:
            data = bytes(value)
    elif value:
        data = bytes(value)  # binary data stays bytes, whatever it happens to decode to
    return _build(lambda: CloudEvent(_binary_attributes(headers, key), data))


def _binary_attributes(headers: dict[str, str], key: str | None) -> dict[str, Any]:
    attributes: dict[str, Any] = {}
    for name, text in headers.items():
        if name.startswith(CE_PREFIX):
            attribute = name[len(CE_PREFIX) :]
            attributes[attribute] = _parse_time(text) if attribute == "time" else text
        elif name == CONTENT_TYPE:
            attributes["datacontenttype"] = text
    if key is not None:
        attributes["partitionkey"] = key
    return attributes


def _parse_time(text: str) -> datetime:
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        parsed: datetime = isoparse(text)  # the SDK's parser, for RFC 3339 forms the stdlib refuses
        return parsed


def _is_text(content_type: str | None) -> bool:
    return content_type is not None and content_type.strip().lower().startswith("text/")


def _decode_structured(content_type: str, message: KafkaMessage) -> CloudEvent:
    media_type = content_type.split(";", 1)[0].strip().lower()
    if media_type != STRUCTURED_JSON:
        raise UnsupportedFormatError(f"unsupported structured event format {media_type!r}")
    document = _check_json(message.value, "structured event")
    if not isinstance(document, dict):
        raise InvalidJSONError("structured event is not a JSON object")
    missing = [
        name for name in REQUIRED if not isinstance(document.get(name), str) or not document[name]
    ]
    if missing:
        raise MissingAttributesError(f"missing CloudEvents attribute(s): {', '.join(missing)}")
    if document["specversion"] != SPECVERSION:
        raise InvalidAttributeError("unsupported specversion: only 1.0 is accepted")
    return _build(lambda: from_structured(message, _FORMAT, CloudEvent))


def _check_json(value: bytes, what: str) -> Any:
    try:
        return json.loads(value)
    except (ValueError, UnicodeDecodeError):
        raise InvalidJSONError(f"{what} is not valid JSON for its content type") from None


def _build(factory: Any) -> CloudEvent:
    try:
        event = factory()
    except BaseCloudEventException as error:
        raise InvalidAttributeError(_attribute_problem(error)) from None
    except (ValueError, TypeError, OverflowError, KeyError):
        # dateutil's parser (the 'time' attribute) and base64 (data_base64) end up here.
        raise InvalidAttributeError("an attribute has an invalid value (e.g. 'time')") from None
    if not isinstance(event, CloudEvent):
        raise InvalidAttributeError("not a CloudEvents 1.0 event")
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
