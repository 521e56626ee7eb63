"""Decoding conformance with the CloudEvents Kafka protocol binding, in both content modes.

Every record here is built by hand from the binding's rules (``kafka-protocol-binding.md``) and
the JSON event format, not by outboxkit's encoder, so the tests say what the spec says:

- binary mode: each attribute is a ``ce_<name>`` header holding its canonical string,
  ``datacontenttype`` is the ``content-type`` header, the data is the value (3.2);
- structured mode: ``content-type: application/cloudevents+json`` and the whole event in the
  value (3.3), ``ce_`` headers are not attributes;
- an event without data is a record with a null value (3.2.2);
- the Kafka key is not an attribute: ``partitionkey`` comes from the event (3.1), and handlers
  get the key as record metadata (``KafkaRecord``).

No broker needed; ``tests/interop`` checks the same against the CloudEvents Java SDK.
"""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from aiokafka import ConsumerRecord
from cloudevents.core.v1.event import CloudEvent
from outboxkit.consumers import ConsumerApp, KafkaRecord
from outboxkit.consumers.decoding import (
    InvalidAttributeError,
    InvalidJSONError,
    MissingAttributesError,
    UnsupportedFormatError,
    decode_record,
)
from outboxkit.outbox import PermanentError
from sqlalchemy.ext.asyncio import AsyncSession

REQUIRED = {"specversion": "1.0", "id": "evt-1", "source": "/conformance", "type": "conf.tested"}
STRUCTURED = "application/cloudevents+json"
MODES = ("binary", "structured")


def binary(
    attributes: dict[str, str], value: bytes | None = None, content_type: str | None = None
) -> tuple[list[tuple[str, bytes | None]], bytes | None]:
    """Headers and value of a binary-mode record: one ``ce_`` header per attribute."""
    headers: list[tuple[str, bytes | None]] = [
        (f"ce_{name}", text.encode("utf-8")) for name, text in {**REQUIRED, **attributes}.items()
    ]
    if content_type is not None:
        headers.append(("content-type", content_type.encode("utf-8")))
    return headers, value


def structured(
    members: dict[str, Any], content_type: str = STRUCTURED
) -> tuple[list[tuple[str, bytes | None]], bytes]:
    """Headers and value of a structured-mode record (JSON event format)."""
    document = json.dumps({**REQUIRED, **members}, ensure_ascii=False).encode("utf-8")
    return [("content-type", content_type.encode("utf-8"))], document


def decode(
    mode: str,
    attributes: dict[str, Any],
    value: bytes | None = None,
    members: dict[str, Any] | None = None,
) -> CloudEvent:
    """The same event in ``mode``: ``attributes`` as canonical strings in ``ce_`` headers and
    ``value`` as the record's value (binary), or as JSON members beside the data ``members``
    (structured)."""
    if mode == "binary":
        texts = {name: _canonical(each) for name, each in attributes.items()}
        content_type = texts.pop("datacontenttype", None)
        return decode_record(*binary(texts, value, content_type))
    return decode_record(*structured({**attributes, **(members or {})}))


def _canonical(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def record(key: bytes | None, headers: list[tuple[str, bytes | None]], value: bytes | None) -> Any:
    return ConsumerRecord(
        topic="orders",
        partition=3,
        offset=41,
        timestamp=1_700_000_000_123,
        timestamp_type=0,
        key=key,
        value=value,
        checksum=None,
        serialized_key_size=len(key or b""),
        serialized_value_size=len(value or b""),
        headers=headers,
    )


# Optional attributes absent -------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_an_event_with_only_the_required_attributes_gains_none(mode: str) -> None:
    """``time`` is optional: the SDK's constructor would stamp it with the decoding moment."""
    event = decode(mode, {})
    assert event.get_attributes() == REQUIRED
    assert event.get_time() is None
    assert event.get_datacontenttype() is None
    assert event.get_extension("partitionkey") is None
    assert event.get_data() is None


@pytest.mark.parametrize("mode", MODES)
def test_json_null_or_absent_optional_members_stay_absent(mode: str) -> None:
    if mode == "binary":
        event = decode_record(*binary({"subject": "s"}, None))
    else:
        event = decode_record(*structured({"subject": "s", "time": None, "dataschema": None}))
    assert event.get_attributes() == {**REQUIRED, "subject": "s"}


# Every attribute type --------------------------------------------------------------------------

TIME_TEXT = "2024-02-29T23:59:58.123456-07:00"
TIME = datetime(2024, 2, 29, 23, 59, 58, 123456, tzinfo=timezone(timedelta(hours=-7)))
EXTENSIONS = {
    "strext": "Grüße, 世界 ✓",  # String, non-ASCII
    "intext": 2147483647,  # Integer, the top of its 32-bit range
    "negext": -2147483648,
    "boolext": True,  # Boolean
    "falseext": False,
    "binext": base64.b64encode(b"\x00\xff binary").decode(),  # Binary: base64 in both modes
    "uriext": "https://example.com/a?b=c#d",  # URI
    "urirefext": "../relative/ref",  # URI-reference
    "tsext": "1985-04-12T23:20:50.52Z",  # Timestamp: a string, as the binding carries it
}


@pytest.mark.parametrize("mode", MODES)
def test_every_attribute_type_decodes(mode: str) -> None:
    attributes = {
        "time": TIME_TEXT,
        "subject": "orders/ünïcödé",
        "dataschema": "https://schemas.example.com/order/1",
        "datacontenttype": "application/json",
        **EXTENSIONS,
    }
    event = decode(mode, attributes, b'{"a":1}', {"data": {"a": 1}})
    got = event.get_attributes()
    assert got.pop("time") == TIME
    assert event.get_data() == {"a": 1}
    expected = {**REQUIRED, **attributes}
    del expected["time"]
    if mode == "binary":
        # Headers have no types: every extension value is its canonical string.
        expected = {name: _canonical(value) for name, value in expected.items()}
    assert got == expected
    assert {name: type(got[name]) for name in ("intext", "boolext")} == (
        {"intext": str, "boolext": str} if mode == "binary" else {"intext": int, "boolext": bool}
    )


@pytest.mark.parametrize(
    "time_text",
    [
        "1985-04-12T23:20:50Z",
        "1985-04-12T23:20:50.52Z",
        "1985-04-12t23:20:50z",
        "1985-04-12T23:20:50+00:00",
    ],
)
@pytest.mark.parametrize("mode", MODES)
def test_rfc3339_time_forms(mode: str, time_text: str) -> None:
    event = decode(mode, {"time": time_text})
    happened = event.get_time()
    assert happened is not None
    assert happened.replace(microsecond=0) == datetime(1985, 4, 12, 23, 20, 50, tzinfo=UTC)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("time_text", ["yesterday", "1985-04-12T23:20:50", "1985-13-45T00:00:00Z"])
def test_invalid_or_zoneless_time_is_a_permanent_error(mode: str, time_text: str) -> None:
    with pytest.raises(InvalidAttributeError):
        decode(mode, {"time": time_text})


# Extension names at the spec's limits ------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", ["a", "0", "abcdefghij0123456789", "abcdefghij0123456789x"])
def test_extension_names_at_the_limits_are_read(mode: str, name: str) -> None:
    """1 character, digits only, the 20 characters producers SHOULD keep to, and one more (a
    reader stays liberal: the limit is a SHOULD for producers)."""
    assert decode(mode, {name: "v"}).get_extension(name) == "v"


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", ["my-ext", "my_ext", "ext.x", "ünï"])
def test_extension_names_outside_a_z0_9_are_permanent_errors(mode: str, name: str) -> None:
    with pytest.raises(InvalidAttributeError):
        decode(mode, {name: "v"})


@pytest.mark.parametrize(
    "member", [{"nested": "object"}, ["list"], 1.5, 2**31, -(2**31) - 1], ids=repr
)
def test_structured_extension_values_outside_the_type_system_are_refused(member: Any) -> None:
    with pytest.raises(InvalidAttributeError):
        decode_record(*structured({"ext": member}))


@pytest.mark.parametrize("members", [{"id": 7}, {"subject": True}, {"time": 1700000000}])
def test_structured_context_attributes_of_the_wrong_json_type_are_refused(
    members: dict[str, Any],
) -> None:
    with pytest.raises((InvalidAttributeError, MissingAttributesError)):
        decode_record(*structured(members))


# No data, text, binary and JSON data --------------------------------------------------------------

# (content type, binary-mode value, structured-mode members, expected data)
DATA_CASES = [
    ("application/json", None, {}, None),
    ("text/plain", None, {}, None),
    ("application/octet-stream", b"", {}, None),
    ("application/json", b'{"a":[1,"x"]}', {"data": {"a": [1, "x"]}}, {"a": [1, "x"]}),
    ("application/json", b'"just a string"', {"data": "just a string"}, "just a string"),
    ("application/json", b"[1,2]", {"data_base64": base64.b64encode(b"[1,2]").decode()}, [1, 2]),
    ("application/vnd.shop.order+json; charset=utf-8", b"42", {"data": 42}, 42),
    ("text/json", b"true", {"data": True}, True),
    (None, b'{"implied":"json"}', {"data": {"implied": "json"}}, {"implied": "json"}),
    ("text/plain; charset=utf-8", "ünï ✓".encode(), {"data": "ünï ✓"}, "ünï ✓"),
    ("text/csv", b"a,b", {"data_base64": base64.b64encode(b"a,b").decode()}, "a,b"),
    (
        "text/plain",
        b"\xff\xfe",
        {"data_base64": base64.b64encode(b"\xff\xfe").decode()},
        b"\xff\xfe",
    ),
    ("application/octet-stream", b"\x00\x01", {"data_base64": "AAE="}, b"\x00\x01"),
    ("application/octet-stream", b"utf8 text", {"data_base64": "dXRmOCB0ZXh0"}, b"utf8 text"),
    ("application/xml", b"<a/>", {"data": "<a/>"}, b"<a/>"),
]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("content_type", "value", "members", "expected"), DATA_CASES)
def test_data_type_depends_on_the_content_type_only(
    mode: str, content_type: str | None, value: bytes | None, members: dict[str, Any], expected: Any
) -> None:
    """JSON content types (or none) are parsed, ``text/*`` is ``str`` (``bytes`` when it is not
    UTF-8), anything else is ``bytes``, the same in both modes; no data is ``None``."""
    if mode == "binary":
        event = decode_record(*binary({}, value, content_type))
    else:
        ct = {} if content_type is None else {"datacontenttype": content_type}
        event = decode_record(*structured({**ct, **members}))
    assert event.get_data() == expected
    assert type(event.get_data()) is type(expected)
    assert event.get_datacontenttype() == content_type


@pytest.mark.parametrize("mode", MODES)
def test_invalid_json_data_is_a_permanent_error(mode: str) -> None:
    with pytest.raises(InvalidJSONError):
        if mode == "binary":
            decode_record(*binary({}, b"{nope", "application/json"))
        else:
            encoded = base64.b64encode(b"{nope").decode()
            decode_record(
                *structured({"datacontenttype": "application/json", "data_base64": encoded})
            )


@pytest.mark.parametrize(
    "members",
    [
        {"data": "x", "data_base64": "eA=="},
        {"data_base64": "not base64!"},
        {"data_base64": 12},
        {"datacontenttype": "application/octet-stream", "data": {"not": "a string"}},
    ],
)
def test_structured_data_members_that_break_the_format_are_refused(members: dict[str, Any]) -> None:
    with pytest.raises(InvalidAttributeError):
        decode_record(*structured(members))


# Content-type rules ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "content_type",
    ["application/cloudevents+json", "Application/CloudEvents+JSON; charset=utf-8"],
)
def test_structured_mode_is_chosen_by_content_type_and_ce_headers_are_ignored(
    content_type: str,
) -> None:
    headers, value = structured({"subject": "from the envelope"}, content_type)
    headers += [("ce_subject", b"from a header"), ("ce_extra", b"not an attribute")]
    event = decode_record(headers, value)
    assert event.get_subject() == "from the envelope"
    assert event.get_extension("extra") is None


@pytest.mark.parametrize(
    "content_type", ["application/cloudevents+avro", "application/cloudevents-batch+json"]
)
def test_other_structured_formats_and_batches_are_refused(content_type: str) -> None:
    headers, value = structured({}, content_type)
    with pytest.raises(UnsupportedFormatError):
        decode_record(headers, value)


def test_binary_content_type_is_datacontenttype_verbatim_and_not_a_ce_header() -> None:
    headers, value = binary({}, b"hi", "text/plain; charset=utf-8")
    event = decode_record(
        [(name.title() if name == "content-type" else name, v) for name, v in headers], value
    )
    assert event.get_datacontenttype() == "text/plain; charset=utf-8"
    assert event.get_data() == "hi"


def test_binary_mode_without_content_type_has_no_datacontenttype() -> None:
    event = decode_record(*binary({}, b'{"a":1}'))
    assert event.get_datacontenttype() is None
    assert event.get_data() == {"a": 1}


# The Kafka key is record metadata, never an attribute -----------------------------------------


def _keyed(mode: str, partitionkey: str | None) -> tuple[list[tuple[str, bytes | None]], bytes]:
    attributes = {} if partitionkey is None else {"partitionkey": partitionkey}
    if mode == "binary":
        return binary(attributes, b"{}", "application/json")
    return structured({**attributes, "datacontenttype": "application/json", "data": {}})


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    ("key", "partitionkey"),
    [
        (b"user-key-92", "pk-attribute"),  # the key must not overwrite the attribute
        (b"user-key-90", None),  # nor add one
        (None, "pk-only"),
        (b"\xff\x00 not utf-8", None),
    ],
)
def test_the_kafka_key_neither_overwrites_nor_adds_partitionkey(
    mode: str, key: bytes | None, partitionkey: str | None
) -> None:
    headers, value = _keyed(mode, partitionkey)
    event = decode_record(headers, value)
    assert event.get_extension("partitionkey") == partitionkey
    expected = {**REQUIRED, "datacontenttype": "application/json"}
    if partitionkey is not None:
        expected["partitionkey"] = partitionkey
    assert event.get_attributes() == expected
    assert KafkaRecord.of(record(key, headers, value)).key == key


# Handlers get the key beside the event --------------------------------------------------------


def test_a_handler_asks_for_the_record_by_annotation() -> None:
    app = ConsumerApp(name="conformance")

    @app.handler("conf.tested", topic="orders")
    async def one(event: CloudEvent, meta: KafkaRecord, session: AsyncSession) -> None: ...

    @app.batch_handler("conf.batched", topic="orders")
    async def many(events: list[CloudEvent], metas: list[KafkaRecord], s: AsyncSession) -> None: ...

    headers, value = _keyed("binary", "pk-attribute")
    consumed = record(b"user-key-92", headers, value)
    event = decode_record(consumed.headers, consumed.value)
    handler = app.handler_for("orders", "conf.tested")
    assert handler is not None
    arguments = handler.bind(event, consumed)
    assert arguments["event"] is event
    assert arguments["meta"] == KafkaRecord(
        topic="orders",
        partition=3,
        offset=41,
        key=b"user-key-92",
        timestamp=datetime(2023, 11, 14, 22, 13, 20, 123000, tzinfo=UTC),
        headers=tuple(headers),
    )
    assert event.get_extension("partitionkey") == "pk-attribute"
    batch = app.handler_for("orders", "conf.batched")
    assert batch is not None and [p.kind for p in batch.params] == ["event", "record", "session"]


def test_a_record_without_timestamp_has_none() -> None:
    consumed = record(None, [], None)
    object.__setattr__(consumed, "timestamp", -1)
    assert KafkaRecord.of(consumed).timestamp is None


def test_decode_errors_are_permanent() -> None:
    for error in (
        InvalidAttributeError,
        InvalidJSONError,
        MissingAttributesError,
        UnsupportedFormatError,
    ):
        assert issubclass(error, PermanentError)
