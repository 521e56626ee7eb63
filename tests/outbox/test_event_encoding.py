"""What ``new_event`` and ``encode_binary`` put on the wire, checked against the CloudEvents
Kafka binding (binary mode) and read back by the consumer's decoder. No database needed."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from outboxkit.consumers.decoding import decode_record
from outboxkit.outbox import InvalidEventError, encode_binary, new_event


def wire(event: object) -> tuple[dict[str, str], bytes | None, bytes]:
    encoded = encode_binary(event)  # type: ignore[arg-type]
    return encoded.headers, encoded.key, encoded.payload


def test_an_event_without_data_has_no_content_type_and_an_empty_payload() -> None:
    """Binding 3.2.2: no data is a record with no value (the relay turns the empty payload into
    a null value); no data means no ``datacontenttype`` to describe it."""
    event = new_event("t", "/s")
    assert event.get_datacontenttype() is None
    headers, _, payload = wire(event)
    assert "content-type" not in headers
    assert payload == b""
    decoded = decode_record([(k, v.encode()) for k, v in headers.items()], None)
    assert decoded.get_data() is None and decoded.get_datacontenttype() is None


def test_an_explicit_content_type_without_data_is_kept() -> None:
    headers, _, payload = wire(new_event("t", "/s", datacontenttype="application/json"))
    assert headers["content-type"] == "application/json" and payload == b""


@pytest.mark.parametrize(
    ("data", "content_type", "payload"),
    [
        ({"a": [1, "ü"]}, "application/json", b'{"a":[1,"\\u00fc"]}'),
        ([1, 2], "application/json", b"[1,2]"),
        ("plain ✓", "text/plain; charset=utf-8", "plain ✓".encode()),
        (b"\x00\xff", "application/octet-stream", b"\x00\xff"),
    ],
)
def test_default_content_types_follow_the_data(
    data: object, content_type: str, payload: bytes
) -> None:
    headers, _, encoded = wire(new_event("t", "/s", data))  # type: ignore[arg-type]
    assert headers["content-type"] == content_type
    assert encoded == payload


def test_every_attribute_is_a_ce_header_with_its_canonical_string() -> None:
    happened = datetime(2024, 2, 29, 23, 59, 58, 123456, tzinfo=timezone(timedelta(hours=-7)))
    event = new_event(
        "order.placed",
        "/shop",
        {"n": 1},
        id="e-1",
        subject="orders/ünï",
        time=happened,
        dataschema="https://schemas.example.com/order/1",
        partitionkey="pk-1",
        extensions={"tenant": "Grüße", "count": -2147483648, "yes": True, "no": False},
    )
    headers, key, _ = wire(event)
    assert headers == {
        "ce_specversion": "1.0",
        "ce_id": "e-1",
        "ce_source": "/shop",
        "ce_type": "order.placed",
        "content-type": "application/json",
        "ce_subject": "orders/ünï",
        "ce_time": "2024-02-29T23:59:58.123456-07:00",
        "ce_dataschema": "https://schemas.example.com/order/1",
        "ce_partitionkey": "pk-1",
        "ce_tenant": "Grüße",
        "ce_count": "-2147483648",
        "ce_yes": "true",
        "ce_no": "false",
    }
    assert key == b"pk-1"  # binding 3.1: partitionkey is the key, and stays an attribute


def test_utc_time_is_written_with_z() -> None:
    headers, _, _ = wire(new_event("t", "/s", time=datetime(2024, 1, 1, tzinfo=UTC)))
    assert headers["ce_time"] == "2024-01-01T00:00:00Z"


def test_without_partitionkey_there_is_no_key() -> None:
    headers, key, _ = wire(new_event("t", "/s", {"a": 1}))
    assert key is None and "ce_partitionkey" not in headers


@pytest.mark.parametrize("name", ["a", "0", "abcdefghij0123456789"])
def test_extension_names_up_to_twenty_characters_are_accepted(name: str) -> None:
    headers, _, _ = wire(new_event("t", "/s", extensions={name: "v"}))
    assert headers[f"ce_{name}"] == "v"


@pytest.mark.parametrize(
    "extensions",
    [
        {"abcdefghij0123456789x": "v"},  # 21 characters: producers SHOULD keep to 20
        {"Tenant": "v"},
        {"my-ext": "v"},
        {"": "v"},
        {"data": "v"},
        {"data_base64": "v"},
        {"time": "v"},
        {"big": 2**31},
        {"small": -(2**31) - 1},
        {"float": 1.5},
        {"empty": ""},
    ],
    ids=repr,
)
def test_extensions_outside_the_spec_are_refused_before_commit(extensions: dict) -> None:  # type: ignore[type-arg]
    with pytest.raises(InvalidEventError):
        new_event("t", "/s", extensions=extensions)
