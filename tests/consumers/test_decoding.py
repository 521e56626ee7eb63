"""Reading CloudEvents from Kafka records (binary and structured mode) without a broker."""

from __future__ import annotations

import inspect
import json
import random
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from aiokafka import ConsumerRecord
from cloudevents.core.bindings.kafka import KafkaMessage, from_binary, to_structured
from cloudevents.core.exceptions import CloudEventValidationError
from cloudevents.core.formats.json import JSONFormat
from cloudevents.core.v1.event import CloudEvent
from hypothesis import example, given, settings
from hypothesis import strategies as st
from outboxkit.consumers import ConsumerApp, decoding
from outboxkit.consumers.apply import Applier, _Failure, _Run
from outboxkit.consumers.decoding import (
    DecodedEvent,
    InvalidAttributeError,
    InvalidJSONError,
    MissingAttributesError,
    NotACloudEventError,
    decode_lazily,
    decode_record,
    invalid_attributes,
)
from outboxkit.consumers.metrics import ConsumerStats
from outboxkit.consumers.tracing import HandlerTelemetry
from outboxkit.outbox import PermanentError, encode_binary, new_event
from pydantic import BaseModel, ValidationError
from sqlalchemy.ext.asyncio import AsyncSession


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
    # The runtime's own path: decoded lazily, its arguments bound by the handler (a model
    # validated from the bytes, the event beside it) and checked, exactly as Applier does it.
    for run in _prepared(headers, record_key, value):
        event = run.arguments["event"]
        assert event.get_attributes() == theirs.get_attributes()
        assert event.get_data() == theirs.get_data()
        if isinstance(theirs.get_data(), dict) and isinstance(theirs.get_data().get("n"), int):
            assert run.arguments["item"] == Item.model_validate(theirs.get_data())


class Item(BaseModel):
    """What the handlers below validate the data into (fields absent or wrong: refused)."""

    n: int


def _applier(unhandled: str = "skip") -> Applier:
    """An applier of two handlers of ``order.placed``: per event and batch, model and event."""
    app = ConsumerApp(name="decoding", unhandled=unhandled)  # type: ignore[arg-type]

    @app.handler("order.placed", topic="each")
    async def each(item: Item, event: CloudEvent, session: AsyncSession) -> None: ...

    @app.batch_handler("order.placed", topic="batch")
    async def batch(item: list[Item], event: list[CloudEvent], session: AsyncSession) -> None: ...

    @app.handler("order.placed", topic="event-only")
    async def event_only(event: CloudEvent, session: AsyncSession) -> None: ...

    return Applier(app, None, HandlerTelemetry("g", "decoding"), ConsumerStats())  # type: ignore[arg-type]


def _record(topic: str, headers: Any, key: bytes | None, value: bytes | None) -> Any:
    return ConsumerRecord(
        topic, 0, 0, 0, 0, key, value, None, len(key or b""), len(value or b""), headers
    )


def _prepared(headers: Any, key: bytes | None, value: bytes | None) -> list[_Run]:
    """The runs the runtime prepares for this record on each topic whose model it fits; the
    event-only handler's run always (any valid data)."""
    applier = _applier()
    runs = []
    for topic in ("each", "batch", "event-only"):
        (step,) = applier.steps([_record(topic, headers, key, value)])
        if isinstance(step, _Failure):
            assert topic != "event-only", step.error
            assert isinstance(step.error, ValidationError)
            continue
        assert isinstance(step, _Run)
        runs.append(step)
    return runs


_JSONISH = st.lists(
    st.sampled_from(
        [
            b"{",
            b"}",
            b"[",
            b"]",
            b",",
            b":",
            b'"n"',
            b'"x"',
            b"1",
            b"-0",
            b"1.5",
            b"1e400",
            b"NaN",
            b"true",
            b"null",
            b" ",
            b"\\",
            b'"\\ud800"',
            b"\xff",
            b"\xef\xbb\xbf",
            b'"\\u0000"',
            b"\n",
            b'"a\nb"',
            b"01",
            b'{"n": 1}',
            b'{"n": "2"}',
            b'{"n": 1.0}',
            b'{"n": [1]}',
        ]
    ),
    max_size=12,
).map(b"".join)


@settings(max_examples=400, deadline=None)
@given(value=_JSONISH | st.binary(max_size=20))
def test_lazy_model_validation_agrees_with_parsing_first(value: bytes) -> None:
    """A model validated straight from the bytes (pydantic's JSON mode) accepts and refuses
    what parsing with ``json.loads`` and validating the result did, with the same error."""
    headers, _, _ = binary(new_event("order.placed", "/s", {"n": 1}))
    try:  # an empty value is an event without data (binding 3.2.2): None
        expected: Any = Item.model_validate(json.loads(value) if value else None)
    except ValueError as error:  # JSONDecodeError, UnicodeDecodeError, ValidationError
        expected = ValidationError if isinstance(error, ValidationError) else InvalidJSONError
    except RecursionError:
        expected = InvalidJSONError
    lazy = decode_lazily(headers, value)
    try:
        got: Any = lazy.validate_data(Item)
    except (ValidationError, InvalidJSONError) as error:
        got = type(error) if isinstance(error, InvalidJSONError) else ValidationError
    assert got == expected
    if got == expected and isinstance(expected, Item):
        assert lazy.get_data() == json.loads(value)  # parsed on demand: the same data
    # And the runtime refuses the record before any handler runs, whichever handler it is.
    if value.strip():
        for topic in ("each", "event-only"):
            (step,) = _applier().steps([_record(topic, headers, None, value)])
            if expected is InvalidJSONError:
                assert isinstance(step, _Failure) and isinstance(step.error, InvalidJSONError)


def test_an_unhandled_record_with_invalid_json_is_still_refused() -> None:
    headers, _, _ = binary(new_event("other.type", "/s", {"n": 1}))
    (step,) = _applier("dead-letter").steps([_record("each", headers, None, b"{nope")])
    assert isinstance(step, _Failure) and isinstance(step.error, InvalidJSONError)


_NAMES = st.sampled_from(
    [
        "id",
        "source",
        "type",
        "specversion",
        "time",
        "subject",
        "datacontenttype",
        "dataschema",
        "data",
        "ext1",
        "Ext",
        "my-ext",
        "a",
        "abc\n",
        "ünï",
        "x" * 30,
    ]
)
_VALUES = st.one_of(
    st.text(max_size=3),
    st.sampled_from(["1.0", "0.3", ""]),
    st.integers(-2, 2),
    st.booleans(),
    st.none(),
    st.datetimes(timezones=st.none() | st.just(UTC)),
)


@settings(max_examples=400, deadline=None)
@given(attributes=st.dictionaries(_NAMES, _VALUES, max_size=6))
def test_attribute_rules_are_the_sdk_constructors(attributes: dict[str, Any]) -> None:
    """The decoder checks attributes itself instead of through the SDK's constructor: it must
    refuse exactly the names the constructor refuses."""
    complete = {"id": "1", "source": "/s", "type": "t", "specversion": "1.0", "time": NOW}
    complete.update(attributes)
    try:
        CloudEvent(dict(complete))
        refused: list[str] = []
    except CloudEventValidationError as error:
        refused = sorted(error.errors)
    assert invalid_attributes(complete) == refused


NOW = datetime(2026, 1, 1, tzinfo=UTC)


def test_the_decoded_event_answers_every_getter_itself() -> None:
    """It is built without the SDK constructor, so it must not fall back on the SDK's internal
    state for any public method (a new getter in an SDK release fails here)."""
    public = {name for name, _ in inspect.getmembers(CloudEvent, inspect.isfunction)}
    public = {name for name in public if not name.startswith("_")}
    assert public <= set(vars(DecodedEvent)), public - set(vars(DecodedEvent))


_HEADER_NAMES = st.sampled_from(
    [
        "ce_id",
        "ce_source",
        "ce_type",
        "ce_specversion",
        "ce_time",
        "ce_subject",
        "ce_datacontenttype",
        "ce_dataschema",
        "ce_data",
        "ce_",
        "CE_Type",
        "ce_partitionkey",
        "ce_my-ext",
        "ce_abc\n",
        "content-type",
        "Content-Type",
        "traceparent",
        "x-other",
    ]
)
_HEADER_VALUES = st.one_of(
    st.none(),
    st.sampled_from(
        [
            b"",
            b"1.0",
            b"0.3",
            b"/s",
            b"t",
            b"application/json",
            b"text/plain",
            b"application/octet-stream",
            b"application/cloudevents+json",
            b"2026-01-01T00:00:00Z",
            b"2026-01-01T00:00:00",
            b"2026-01-01T00:00:00.5+02:00",
            b"20260101T000000Z",
            b"not a time",
            b"\xff\xfe",
        ]
    ),
    st.binary(max_size=4),
)
_COMPLETE = [
    ("ce_id", b"e-1"),
    ("ce_source", b"/s"),
    ("ce_type", b"t"),
    ("ce_specversion", b"1.0"),
]


def _outcome(decode: Any, headers: list[tuple[str, bytes | None]], value: bytes | None) -> Any:
    """What decoding gives: the attributes and data, or the error's class and message."""
    try:
        event = decode(headers, value)
        return ("event", event.get_attributes(), event.get_data())
    except Exception as error:
        return ("error", type(error), str(error))


@settings(max_examples=600, deadline=None)
@given(
    extra=st.lists(st.tuples(_HEADER_NAMES, _HEADER_VALUES), max_size=5),
    drop=st.sets(st.integers(0, 3), max_size=2),
    value=st.none() | st.sampled_from([b"", b'{"n": 1}', b"{nope", b"text", b"\xff"]),
    shuffle=st.randoms(use_true_random=False),
)
@example(
    extra=[("ce_time", b"2026-01-01T00:00:00")],
    drop=set(),
    value=b'{"n": 1}',
    shuffle=random.Random(1),
)
@example(
    extra=[("ce_time", b"20260101T000000Z")],
    drop=set(),
    value=b'{"n": 1}',
    shuffle=random.Random(1),
)
@example(
    extra=[("ce_time", b"2026-01-01T00:00:00.5+02:00")],
    drop=set(),
    value=b'{"n": 1}',
    shuffle=random.Random(1),
)
@example(extra=[("CE_ID", b"e-2")], drop=set(), value=b'{"n": 1}', shuffle=random.Random(1))
@example(
    extra=[("content-type", b"text/plain"), ("ce_datacontenttype", b"text/plain")],
    drop=set(),
    value=b'{"n": 1}',
    shuffle=random.Random(1),
)
@example(extra=[("content-type", b"")], drop=set(), value=b'{"n": 1}', shuffle=random.Random(1))
@example(
    extra=[("Content-Type", b"application/cloudevents+json")],
    drop=set(),
    value=b'{"n": 1}',
    shuffle=random.Random(1),
)
@example(extra=[("ce_subject", b"")], drop=set(), value=b'{"n": 1}', shuffle=random.Random(1))
@example(
    extra=[("ce_subject", None), ("ce_partitionkey", None)],
    drop=set(),
    value=b'{"n": 1}',
    shuffle=random.Random(1),
)
@example(extra=[("ce_my-ext", b"x")], drop=set(), value=b'{"n": 1}', shuffle=random.Random(1))
@example(extra=[("ce_abc\n", b"x")], drop=set(), value=b'{"n": 1}', shuffle=random.Random(1))
@example(extra=[("ce_data", b"x")], drop=set(), value=b'{"n": 1}', shuffle=random.Random(1))
@example(extra=[("ce_", b"x")], drop=set(), value=b'{"n": 1}', shuffle=random.Random(1))
@example(
    extra=[("ce_partitionkey", b"\xff")], drop=set(), value=b'{"n": 1}', shuffle=random.Random(1)
)
@example(extra=[("traceparent", b"\xff")], drop=set(), value=b'{"n": 1}', shuffle=random.Random(1))
def test_the_one_pass_binary_decoder_agrees_with_the_general_one(  # type: ignore[no-untyped-def]
    extra, drop, value, shuffle
) -> None:
    """``decode_lazily`` reads the usual binary-mode record in one pass over its headers and
    hands anything else to the general decoder: whatever the headers (missing, repeated,
    empty, not UTF-8, odd names, structured content type), the outcome is the general
    decoder's, the same event or the same error."""
    headers = [h for i, h in enumerate(_COMPLETE) if i not in drop] + extra
    shuffle.shuffle(headers)

    def general(headers: Any, value: bytes | None) -> DecodedEvent:
        event = decoding._decode_any(headers, value)
        decoding._check_sizes(event)
        event.check_data()
        return event

    assert _outcome(decode_record, headers, value) == _outcome(general, headers, value)
