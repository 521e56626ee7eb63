"""Reading CloudEvents from Kafka records (binary and structured mode) without a broker."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from cloudevents.core.bindings.kafka import KafkaMessage, from_binary, to_structured
from cloudevents.core.formats.json import JSONFormat
from cloudevents.core.v1.event import CloudEvent
from hypothesis import given, settings
from hypothesis import strategies as st
from outboxkit.consumers.decoding import (
    InvalidAttributeError,
    InvalidJSONError,
    MissingAttributesError,
    NotACloudEventError,
    decode_record,
)
from outboxkit.outbox import PermanentError, encode_binary, new_event


def binary(event: CloudEvent) -> tuple[list[tuple[str, bytes | None]], bytes | None, bytes]:
    encoded = encode_binary(event)
    headers = [(k, v.encode()) for k, v in encoded.headers.items()]
    return headers, encoded.key, encoded.payload


def test_binary_record_decodes_with_data_and_partition_key() -> None:
    event = new_event("order.placed", "/shop", {"order_id": 1}, id="e-1", partitionkey="cust-7")
    headers, _, value = binary(event)
    headers.append(("traceparent", b"\xff\xfe not utf-8"))  # unrelated headers are ignored
    decoded = decode_record(headers, value)
    assert (decoded.get_source(), decoded.get_id(), decoded.get_type()) == (
        "/shop",
        "e-1",
        "order.placed",
    )
    assert decoded.get_data() == {"order_id": 1}
    assert decoded.get_extension("partitionkey") == "cust-7"


def test_structured_mode_is_chosen_by_content_type_even_with_ce_headers() -> None:
    event = CloudEvent(
        {"type": "t", "source": "/s", "id": "body", "datacontenttype": "application/json"}, {"a": 1}
    )
    message = to_structured(event, JSONFormat())
    headers = [
        ("Content-Type", b"application/cloudevents+json; charset=utf-8"),
        ("ce_id", b"header"),
    ]
    decoded = decode_record(headers, message.value)
    assert decoded.get_id() == "body" and decoded.get_data() == {"a": 1}


def test_missing_id_is_an_error_not_a_random_id() -> None:
    headers, _, value = binary(new_event("t", "/s", {"a": 1}))
    headers = [(k, v) for k, v in headers if k != "ce_id"]
    with pytest.raises(MissingAttributesError, match="id"):
        decode_record(headers, value)


def test_invalid_json_is_rejected_although_the_sdk_would_return_a_string() -> None:
    headers, _, _ = binary(new_event("t", "/s", {"a": 1}))
    with pytest.raises(InvalidJSONError) as raised:
        decode_record(headers, b'{"card": "4111 1111"')
    assert "4111" not in str(raised.value)


DEEP = 100_000  # far past the interpreter's recursion limit


@pytest.mark.parametrize("mode", ["binary", "structured"])
def test_json_nested_too_deeply_is_invalid_json_not_a_recursion_error(mode: str) -> None:
    nested = b"[" * DEEP + b"]" * DEEP
    if mode == "binary":
        headers, _, _ = binary(new_event("t", "/s", {"a": 1}))
        value = nested
    else:
        headers = [("content-type", b"application/cloudevents+json")]
        envelope = b'{"specversion": "1.0", "id": "1", "source": "/s", "type": "t", "data": '
        value = envelope + nested + b"}"
    with pytest.raises(InvalidJSONError, match="nested too deeply"):
        decode_record(headers, value)


def test_non_json_content_type_keeps_text_and_bytes() -> None:
    headers, _, value = binary(new_event("t", "/s", b"\x00\x01"))
    assert decode_record(headers, value).get_data() == b"\x00\x01"
    headers, _, value = binary(new_event("t", "/s", "plain words"))
    assert decode_record(headers, value).get_data() == "plain words"


@pytest.mark.parametrize(
    ("headers", "error"),
    [
        ([], NotACloudEventError),
        ([("content-type", b"application/json")], NotACloudEventError),
        ([("ce_type", b"t"), ("ce_specversion", b"1.0")], MissingAttributesError),
        (
            [("ce_id", b"1"), ("ce_source", b"/s"), ("ce_type", b"t"), ("ce_specversion", b"0.3")],
            InvalidAttributeError,
        ),
        (
            [("ce_id", b"1"), ("ce_id", b"2"), ("ce_source", b"/s"), ("ce_type", b"t")],
            InvalidAttributeError,
        ),
        (
            [
                ("ce_id", b"1"),
                ("ce_source", b"/" + b"s" * 600),
                ("ce_type", b"t"),
                ("ce_specversion", b"1.0"),
            ],
            InvalidAttributeError,
        ),
    ],
)
def test_malformed_headers_are_permanent_decode_errors(headers, error) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(error):
        decode_record(headers, b"{}")
    assert issubclass(error, PermanentError)


_TIMES = st.datetimes(
    min_value=datetime(1970, 1, 2),
    timezones=st.sampled_from([UTC, timezone(timedelta(hours=-7))]),
)
_DATA = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=10,
)


@settings(max_examples=150, deadline=None)
@given(
    data=_DATA,
    happened=_TIMES,
    key=st.none() | st.text(min_size=1, max_size=12),
    subject=st.none() | st.text(min_size=1, max_size=12),
)
def test_binary_decoding_agrees_with_the_sdk_reader(data, happened, key, subject) -> None:  # type: ignore[no-untyped-def]
    """The runtime reads binary mode itself (one JSON parse, stdlib time parsing); whatever the
    outbox writes, it must decode to what the SDK's own ``from_binary`` gives."""
    event = new_event(
        "order.placed", "/shop", data, id="e-1", partitionkey=key, subject=subject, time=happened
    )
    headers, record_key, value = binary(event)
    ours = decode_record(headers, value)
    # The SDK copies the Kafka key into partitionkey; the relay's key is the partitionkey, so
    # the two agree, but only because of that (the key is never read here).
    message = KafkaMessage(headers=dict(headers), key=record_key, value=value)
    theirs = from_binary(message, JSONFormat(), CloudEvent)
    assert ours.get_attributes() == theirs.get_attributes()
    assert ours.get_data() == theirs.get_data()
