"""Pieces of the consumer runtime that need no broker: decoding, classification, backoff."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta, timezone

import pytest
from cloudevents.core.bindings.kafka import KafkaMessage, from_binary, to_structured
from cloudevents.core.formats.json import JSONFormat
from cloudevents.core.v1.event import CloudEvent
from hypothesis import given, settings
from hypothesis import strategies as st
from outboxkit.consumers import ConsumerApp, HandlerSignatureError, dlq_headers
from outboxkit.consumers.decoding import (
    InvalidAttributeError,
    InvalidJSONError,
    MissingAttributesError,
    NotACloudEventError,
    decode_record,
)
from outboxkit.consumers.dlq import DeadLetter, dead_letter_headers, dlq_topic_for
from outboxkit.consumers.errors import Category, classify, safe_message
from outboxkit.outbox import PermanentError, RetryPolicy, TransientError, encode_binary, new_event
from outboxkit.outbox.backoff import Backoff
from pydantic import BaseModel, ValidationError
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session


class Order(BaseModel):
    order_id: int


def binary(event: CloudEvent) -> tuple[list[tuple[str, bytes | None]], bytes | None, bytes]:
    encoded = encode_binary(event)
    headers = [(k, v.encode()) for k, v in encoded.headers.items()]
    return headers, encoded.key, encoded.payload


def test_binary_record_decodes_with_data_and_partition_key() -> None:
    event = new_event("order.placed", "/shop", {"order_id": 1}, id="e-1", partitionkey="cust-7")
    headers, key, value = binary(event)
    headers.append(("traceparent", b"\xff\xfe not utf-8"))  # unrelated headers are ignored
    decoded = decode_record(headers, key, value)
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
    decoded = decode_record(headers, None, message.value)
    assert decoded.get_id() == "body" and decoded.get_data() == {"a": 1}


def test_missing_id_is_an_error_not_a_random_id() -> None:
    headers, key, value = binary(new_event("t", "/s", {"a": 1}))
    headers = [(k, v) for k, v in headers if k != "ce_id"]
    with pytest.raises(MissingAttributesError, match="id"):
        decode_record(headers, key, value)


def test_invalid_json_is_rejected_although_the_sdk_would_return_a_string() -> None:
    headers, key, _ = binary(new_event("t", "/s", {"a": 1}))
    with pytest.raises(InvalidJSONError) as raised:
        decode_record(headers, key, b'{"card": "4111 1111"')
    assert "4111" not in str(raised.value)


def test_non_json_content_type_keeps_text_and_bytes() -> None:
    headers, key, value = binary(new_event("t", "/s", b"\x00\x01"))
    assert decode_record(headers, key, value).get_data() == b"\x00\x01"
    headers, key, value = binary(new_event("t", "/s", "plain words"))
    assert decode_record(headers, key, value).get_data() == "plain words"


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
        decode_record(headers, None, b"{}")
    assert issubclass(error, PermanentError)


def test_binary_key_that_is_not_utf8_does_not_break_decoding() -> None:
    headers, _, value = binary(new_event("t", "/s", {"a": 1}))
    assert decode_record(headers, b"\xff\x00", value).get_extension("partitionkey") is None


class _Orig(Exception):
    def __init__(self, code: str) -> None:
        super().__init__("value 'secret-value' violates something")
        self.pgcode = code


def test_classification() -> None:
    try:
        Order.model_validate({"order_id": "x"})
    except ValidationError as error:
        invalid = error
    assert classify(TransientError()) is Category.TRANSIENT
    assert classify(TimeoutError()) is Category.TRANSIENT
    assert classify(OperationalError("SELECT", {}, Exception("gone"))) is Category.TRANSIENT
    assert classify(DBAPIError("SELECT", {}, _Orig("40001"))) is Category.TRANSIENT
    assert classify(DBAPIError("SELECT", {}, _Orig("40P01"))) is Category.TRANSIENT
    lost = DBAPIError("SELECT", {}, Exception("closed"), connection_invalidated=True)
    assert classify(lost) is Category.TRANSIENT
    assert classify(PermanentError()) is Category.PERMANENT
    assert classify(invalid) is Category.PERMANENT
    assert classify(IntegrityError("INSERT", {}, _Orig("23505"))) is Category.UNKNOWN
    assert classify(KeyError("k")) is Category.UNKNOWN


def test_safe_messages_carry_no_payload() -> None:
    try:
        Order.model_validate({"order_id": "secret-value"})
    except ValidationError as error:
        assert "secret" not in safe_message(error)
        assert "order_id" in safe_message(error)
    failed = IntegrityError("INSERT x VALUES (%(v)s)", {"v": "secret-value"}, _Orig("23505"))
    assert "secret" not in safe_message(failed) and "23505" in safe_message(failed)
    try:
        int("secret-value")
    except ValueError as error:
        text = safe_message(error)
    assert "secret" not in text and "ValueError" in text
    assert safe_message(PermanentError("refund above limit\nsecond line")) == "refund above limit"
    assert len(safe_message(TransientError("x" * 1000))) == 300


def test_retry_policy_is_bounded_in_attempts_and_time() -> None:
    policy = RetryPolicy(
        max_attempts=4, backoff=Backoff(base_s=1.0, cap_s=5.0), max_elapsed_s=100.0
    )
    rng = random.Random(7)
    delays = [policy.delay(n, rng) for n in range(1, 50)]
    assert all(0 <= d <= 5.0 for d in delays)
    assert max(policy.delay(1, rng) for _ in range(200)) <= 1.0
    assert policy.next_delay(3, 0.0) is not None
    assert policy.next_delay(4, 0.0) is None  # attempts exhausted
    assert policy.next_delay(1, 100.5) is None  # total time exhausted
    assert (
        RetryPolicy(backoff=Backoff(base_s=1.0), max_elapsed_s=0.0).next_delay(
            1, 0.0, random.Random(3)
        )
        is None
    )


def test_handler_signatures_are_checked_at_registration() -> None:
    app = ConsumerApp(name="c")

    @app.handler("order.placed", topic="orders")
    async def ok(order: Order, event: CloudEvent, session: AsyncSession) -> None: ...

    @app.handler("order.synced", topic="orders")
    def sync_ok(order: Order, session: Session) -> None: ...

    assert app.topics == ["orders"]
    with pytest.raises(HandlerSignatureError):

        @app.handler("a", topic="orders")
        async def unknown(order: dict) -> None: ...

    with pytest.raises(HandlerSignatureError):

        @app.handler("b", topic="orders")
        def sync_with_async_session(session: AsyncSession) -> None: ...

    with pytest.raises(ValueError, match="already registered"):

        @app.handler("order.placed", topic="orders")
        async def again(order: Order) -> None: ...


def test_dead_letter_headers_replace_earlier_ones_and_keep_the_rest() -> None:
    letter = DeadLetter(
        topic="orders",
        partition=2,
        offset=41,
        timestamp=1_700_000_000_000,
        key=b"k",
        value=b"v",
        headers=[("ce_id", b"1"), (dlq_headers.ERROR_CLASS, b"old"), ("x", None)],
        error_class="permanent:PermanentError",
        error_message="m",
        attempts=1,
        first_failure_ms=5,
        last_failure_ms=6,
    )
    headers = dead_letter_headers(letter, "billing")
    assert headers[:2] == [("ce_id", b"1"), ("x", None)]
    facts = dict(headers[2:])
    assert list(facts) == list(dlq_headers.ALL)
    assert facts[dlq_headers.ERROR_CLASS] == b"permanent:PermanentError"
    assert facts[dlq_headers.ORIGINAL_OFFSET] == b"41"
    assert dlq_topic_for("{topic}.dlq", "orders") == "orders.dlq"


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
    ours = decode_record(headers, record_key, value)
    message = KafkaMessage(headers=dict(headers), key=record_key, value=value)
    theirs = from_binary(message, JSONFormat(), CloudEvent)
    assert ours.get_attributes() == theirs.get_attributes()
    assert ours.get_data() == theirs.get_data()
