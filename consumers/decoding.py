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

The attributes are checked here against the rules of the SDK's ``CloudEvent`` constructor
(:func:`invalid_attributes`), and the event is a :class:`DecodedEvent`: a ``CloudEvent`` that
answers from what was checked instead of validating everything a second time (that constructor
cost as much as the rest of decoding together). :func:`decode_lazily` (the runtime's reader)
leaves binary-mode JSON data unparsed until it is asked for: a pydantic model validates it
straight from the bytes (:meth:`DecodedEvent.validate_data`), and
:meth:`DecodedEvent.check_data` parses it when nothing did, so invalid JSON is refused before
any handler runs either way. ``tests/consumers/test_decoding.py`` holds all of it to the SDK:
the same attributes refused, the same event read, eagerly and lazily.
"""

from __future__ import annotations

import base64
import binascii
import functools
import json
import re
from collections.abc import Sequence
from datetime import datetime
from typing import Any, TypeVar

from cloudevents.core.v1.event import CloudEvent
from dateutil.parser import isoparse
from outboxkit.consumers.tables import EVENT_ID_MAX, SOURCE_MAX
from outboxkit.outbox.errors import PermanentError
from pydantic import BaseModel, ValidationError

CE_PREFIX = "ce_"
CONTENT_TYPE = "content-type"
STRUCTURED_PREFIX = "application/cloudevents"
STRUCTURED_JSON = "application/cloudevents+json"
REQUIRED = ("specversion", "id", "source", "type")
# Context attributes whose type is String, URI, URI-reference or URI-template: JSON strings.
STRING_ATTRIBUTES = frozenset({*REQUIRED, "datacontenttype", "dataschema", "subject"})
SPECVERSION = "1.0"
TIME = "time"

# The SDK's rules (cloudevents.core.v1.event.CloudEvent._validate_attribute), mirrored exactly.
_NON_EMPTY_STRINGS = frozenset({"id", "source", "type"})
_OPTIONAL_STRINGS = frozenset({"subject", "datacontenttype", "dataschema"})
_EXTENSION_NAME = re.compile(r"^[a-z0-9]+$")

_JSON_CONTENT_TYPE = re.compile(r"^(application|text)/([a-zA-Z0-9.+-]+\+)?json(;.*)?$")
_INT32 = range(-(2**31), 2**31)

Headers = Sequence[tuple[str, bytes | None]]
Model = TypeVar("Model", bound=BaseModel)


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


class DecodedEvent(CloudEvent):
    """A CloudEvents 1.0 event read from a Kafka record, its attributes checked by the decoder.

    It is a ``CloudEvent`` (the SDK's class) and answers every getter of the SDK's
    ``BaseCloudEvent`` protocol from the attributes and data the decoder checked, without the
    SDK constructor's second validation or its defaults (an absent ``time`` stays absent).
    """

    __slots__ = ("_checked", "_checked_data", "_json_data", "_json_valid")

    def __init__(
        self, attributes: dict[str, Any], data: Any, json_data: bytes | None = None
    ) -> None:
        # The base constructor is not called on purpose: see the class docstring.
        self._checked = attributes
        self._checked_data = data
        # JSON data not parsed yet (decode_lazily), and whether a model read it as valid JSON.
        self._json_data = json_data
        self._json_valid = False

    def get_id(self) -> str:
        """The ``id`` attribute."""
        return self._checked["id"]  # type: ignore[no-any-return]

    def get_source(self) -> str:
        """The ``source`` attribute."""
        return self._checked["source"]  # type: ignore[no-any-return]

    def get_type(self) -> str:
        """The ``type`` attribute."""
        return self._checked["type"]  # type: ignore[no-any-return]

    def get_specversion(self) -> str:
        """The ``specversion`` attribute (always ``1.0``)."""
        return self._checked["specversion"]  # type: ignore[no-any-return]

    def get_datacontenttype(self) -> str | None:
        """The ``datacontenttype`` attribute, if sent."""
        return self._checked.get("datacontenttype")

    def get_dataschema(self) -> str | None:
        """The ``dataschema`` attribute, if sent."""
        return self._checked.get("dataschema")

    def get_subject(self) -> str | None:
        """The ``subject`` attribute, if sent."""
        return self._checked.get("subject")

    def get_time(self) -> datetime | None:
        """The ``time`` attribute, if sent."""
        return self._checked.get(TIME)

    def get_extension(self, extension_name: str) -> Any:
        """The value of an extension attribute (any attribute, in fact), or ``None``."""
        return self._checked.get(extension_name)

    def get_data(self) -> Any:
        """The data: parsed JSON, ``str`` or ``bytes`` by content type, ``None`` if none.

        Raises :class:`InvalidJSONError` if JSON data left unparsed is not valid JSON (only
        before :meth:`check_data`, which the runtime calls before any handler runs).
        """
        if self._json_data is not None:
            self._checked_data = _check_json(self._json_data, "data")
            self._json_data = None
        return self._checked_data

    def check_data(self) -> None:
        """Refuse data of a JSON content type that is not valid JSON (:class:`InvalidJSONError`),
        parsing it now unless a model already validated it from the bytes."""
        if self._json_data is not None and not self._json_valid:
            self.get_data()

    def validate_data(self, model: type[Model]) -> Model:
        """The data validated into ``model``; pydantic's ``ValidationError`` if it does not fit.

        JSON data not parsed yet is validated straight from its bytes (pydantic's JSON mode, no
        Python objects in between). If that fails, the data is parsed and validated as before
        (Python mode), so the error is the one the data deserves: :class:`InvalidJSONError` for
        invalid JSON, else pydantic's.
        """
        if self._json_data is not None:
            try:
                validated = model.model_validate_json(self._json_data)
            except ValidationError:
                pass
            else:
                self._json_valid = True
                return validated
        data = self.get_data()
        if isinstance(data, bytes | str):
            return model.model_validate_json(data)
        return model.model_validate(data)

    def get_attributes(self) -> dict[str, Any]:
        """Every attribute, by name."""
        return self._checked


def decode_record(headers: Headers, value: bytes | None) -> DecodedEvent:
    """Decode a Kafka record's headers and value into a CloudEvents 1.0 event.

    The record's key is not part of the event (see the module's notes). Raises a
    :class:`DecodeError` subclass, whose message never quotes the payload.
    """
    event = decode_lazily(headers, value)
    event.check_data()
    return event


def decode_lazily(headers: Headers, value: bytes | None) -> DecodedEvent:
    """:func:`decode_record`, every check made but one: JSON data of a binary-mode record is
    left unparsed until the event's :meth:`~DecodedEvent.validate_data`,
    :meth:`~DecodedEvent.check_data` or ``get_data`` reads it.

    Call ``check_data`` (after validating the models that want the data) before trusting it.
    """
    event = _decode_usual(headers, value)
    if event is None:
        event = _decode_any(headers, value)
    _check_sizes(event)
    return event


def _decode_any(headers: Headers, value: bytes | None) -> DecodedEvent:
    """Decode any record, or raise the :class:`DecodeError` that says what is wrong with it."""
    relevant = _relevant_headers(headers)
    content_type = relevant.get(CONTENT_TYPE)
    if content_type is not None and content_type.strip().lower().startswith(STRUCTURED_PREFIX):
        return _decode_structured(content_type, value or b"")
    return _decode_binary(relevant, value, content_type)


# What a header name stands for in binary mode, by its kind; see _header_kind.
_IGNORED, _NON_EMPTY, _SPECVERSION, _TIME, _EXTENSION, _CONTENT_TYPE, _UNUSUAL = range(7)
_HEADER_KINDS: dict[str, tuple[int, str]] = {}
_HEADER_KINDS_MAX = 1024  # names remembered; a producer inventing names gets no more


def _header_kind(raw_name: str) -> tuple[int, str]:
    """How binary mode reads header ``raw_name``: its kind and the attribute it sets.

    Remembered per name: records carry the same handful of header names over and over.
    """
    known = _HEADER_KINDS.get(raw_name)
    if known is not None:
        return known
    name = raw_name.lower()
    attribute = name[3:]
    if name == CONTENT_TYPE:
        kind = (_CONTENT_TYPE, "datacontenttype")
    elif name[:3] != CE_PREFIX:
        kind = (_IGNORED, "")
    elif attribute in _NON_EMPTY_STRINGS or attribute in _OPTIONAL_STRINGS:
        kind = (_NON_EMPTY, attribute)
    elif attribute == "specversion":
        kind = (_SPECVERSION, attribute)
    elif attribute == TIME:
        kind = (_TIME, attribute)
    elif attribute != "data" and _EXTENSION_NAME.match(attribute):
        kind = (_EXTENSION, attribute)
    else:
        kind = (_UNUSUAL, attribute)
    if len(_HEADER_KINDS) < _HEADER_KINDS_MAX:
        _HEADER_KINDS[raw_name] = kind
    return kind


def _decode_usual(headers: Headers, value: bytes | None) -> DecodedEvent | None:
    """The binary-mode record every producer sends, decoded in one pass over its headers;
    ``None`` for anything else (structured mode, a missing, empty, repeated or invalid
    attribute, a header that is not UTF-8, ...), which :func:`_decode_any` then decodes or
    refuses with the error it deserves.

    It accepts exactly the records :func:`_decode_any` reads in binary mode, and reads them
    the same (``tests/consumers/test_decoding.py`` holds the two to each other).
    """
    attributes: dict[str, Any] = {}
    content_type = None
    required = 0
    for raw_name, raw_value in headers:
        kind, attribute = _HEADER_KINDS.get(raw_name) or _header_kind(raw_name)
        if kind == _IGNORED:
            continue
        if kind == _UNUSUAL or attribute in attributes:
            return None
        try:
            text = raw_value.decode("utf-8") if raw_value else ""
        except UnicodeDecodeError:
            return None
        if kind == _NON_EMPTY:
            if not text:
                return None
            if attribute in _NON_EMPTY_STRINGS:
                required += 1
            attributes[attribute] = text
        elif kind == _EXTENSION:
            attributes[attribute] = text
        elif kind == _TIME:
            try:
                happened = datetime.fromisoformat(text)
            except ValueError:
                return None  # maybe a form only the SDK's parser reads
            if not happened.tzinfo:
                return None
            attributes[attribute] = happened
        elif kind == _SPECVERSION:
            if text != SPECVERSION:
                return None
            required += 1
            attributes[attribute] = text
        else:  # content-type
            if not text or text.strip().lower().startswith(STRUCTURED_PREFIX):
                return None
            content_type = attributes[attribute] = text
    if required != len(REQUIRED):
        return None
    if value and is_json_content_type(content_type):
        return DecodedEvent(attributes, None, value)
    return DecodedEvent(attributes, _data_from_bytes(value, content_type))


def invalid_attributes(attributes: dict[str, Any]) -> list[str]:
    """The names of ``attributes`` the SDK's ``CloudEvent`` constructor refuses, sorted.

    Its rules: ``id``, ``source`` and ``type`` non-empty strings, ``specversion`` ``"1.0"``,
    ``time`` a datetime with a time zone, ``subject``, ``datacontenttype`` and ``dataschema``
    non-empty strings, any other name matching ``^[a-z0-9]+$`` (as ``re.match`` reads it) and
    not ``data``. Required attributes that are absent are the caller's to report.
    """
    invalid = []
    for name, value in attributes.items():
        if name in _NON_EMPTY_STRINGS or name in _OPTIONAL_STRINGS:
            bad = not value or not isinstance(value, str)
        elif name == "specversion":
            bad = not isinstance(value, str) or value != SPECVERSION
        elif name == TIME:
            bad = not isinstance(value, datetime) or not value.tzinfo
        else:
            bad = name == "data" or not _EXTENSION_NAME.match(name)
        if bad:
            invalid.append(name)
    return sorted(invalid)


def _relevant_headers(headers: Headers) -> dict[str, str]:
    # Only ce_* and content-type matter; other headers (tracing, the producer's own) may hold
    # anything, including bytes that are not UTF-8, and must not break decoding.
    relevant: dict[str, str] = {}
    for raw_name, raw_value in headers:
        name = raw_name.lower()
        if name[:3] != CE_PREFIX and name != CONTENT_TYPE:
            continue
        if name in relevant:
            raise InvalidAttributeError(f"header {name!r} appears more than once")
        try:
            relevant[name] = raw_value.decode("utf-8") if raw_value else ""
        except UnicodeDecodeError:
            raise InvalidAttributeError(f"header {name!r} is not valid UTF-8") from None
    return relevant


def _decode_binary(
    headers: dict[str, str], value: bytes | None, content_type: str | None
) -> DecodedEvent:
    """Binary mode: each ``ce_`` header is an attribute (its value a string, ``time`` parsed),
    ``content-type`` is ``datacontenttype``, the value is the data."""
    get = headers.get
    if not (get("ce_specversion") and get("ce_id") and get("ce_source") and get("ce_type")):
        if not any(name.startswith(CE_PREFIX) for name in headers):
            raise NotACloudEventError(
                "no ce_ headers and no application/cloudevents content-type: not a CloudEvent"
            )
        missing = [name for name in REQUIRED if not headers.get(CE_PREFIX + name)]
        raise MissingAttributesError(f"missing CloudEvents attribute(s): {', '.join(missing)}")
    if headers["ce_specversion"] != SPECVERSION:
        raise InvalidAttributeError("unsupported specversion: only 1.0 is accepted")
    attributes: dict[str, Any] = {}
    for name, text in headers.items():
        if name == CONTENT_TYPE:
            attributes["datacontenttype"] = text
        else:
            attribute = name[3:]
            attributes[attribute] = _parse_time(text) if attribute == TIME else text
    if value and is_json_content_type(content_type):
        return _build(attributes, None, value)
    return _build(attributes, _data_from_bytes(value, content_type))


def _decode_structured(content_type: str, value: bytes) -> DecodedEvent:
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


def _build(attributes: dict[str, Any], data: Any, json_data: bytes | None = None) -> DecodedEvent:
    invalid = invalid_attributes(attributes)
    if invalid:
        raise InvalidAttributeError(f"invalid CloudEvents attribute(s): {', '.join(invalid)}"[:300])
    return DecodedEvent(attributes, data, json_data)


def _check_sizes(event: DecodedEvent) -> None:
    attributes = event._checked
    if len(attributes["source"]) > SOURCE_MAX:
        raise InvalidAttributeError(f"'source' is longer than {SOURCE_MAX} characters")
    if len(attributes["id"]) > EVENT_ID_MAX:
        raise InvalidAttributeError(f"'id' is longer than {EVENT_ID_MAX} characters")
