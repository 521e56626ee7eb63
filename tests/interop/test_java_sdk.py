"""Interop with the official CloudEvents Java SDK (4.0.1) over the real broker.

1. Records the relay publishes are decoded by the Java SDK's ``CloudEventDeserializer`` with
   every attribute equal, and the same Kafka key.
2. Events the Java SDK's ``CloudEventSerializer`` publishes, in binary and in structured mode,
   are applied once by a ``ConsumerApp`` (a redelivery of each is skipped by the inbox), and
   the handler sees every attribute the Java side set, and none it did not set: no invented
   ``time``, no ``partitionkey`` taken from the key, which arrives as ``KafkaRecord.key``.
"""

from __future__ import annotations

import base64
import json
import uuid
from datetime import datetime
from typing import Any

from cloudevents.core.v1.event import CloudEvent
from outboxkit.consumers import ConsumerApp, KafkaRecord
from outboxkit.outbox import encode_binary, new_event
from outboxkit.outbox.kafka_settings import KafkaSettings
from outboxkit.relay import Relay
from outboxkit.testing.kafka import create_topic
from sqlalchemy import insert
from sqlalchemy.ext.asyncio import AsyncSession

from tests.interop.java_sdk import JavaSDK, java_event
from tests.relay.test_relay import FAST, write_events
from tests.support.consumer_apps import consumer_effects
from tests.support.consumers import alive, create_effects_table, effect_rows, running
from tests.support.kafka import read_topic, wait_for
from tests.support.waits import scaled

CONTEXT = (
    "specversion",
    "id",
    "source",
    "type",
    "datacontenttype",
    "dataschema",
    "subject",
    "time",
)
INTEROP_TYPE = "interop.checked"


def canonical(value: Any) -> str:
    """The CloudEvents canonical string of an attribute value (binary mode carries these)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


# 1. outboxkit relay -> Java SDK ------------------------------------------------------------------


def relay_events() -> list[CloudEvent]:
    """One event per shape the binding distinguishes."""
    happened = datetime.fromisoformat("2024-02-29T23:59:58.123456-07:00")
    return [
        new_event(
            INTEROP_TYPE,
            "/outboxkit/relay",
            {"order": 7, "items": ["a", "ü"]},
            id="json-full",
            subject="orders/ünïcödé",
            time=happened,
            dataschema="https://schemas.example.com/order/1",
            partitionkey="pk-7",
            extensions={
                "tenant": "Grüße 世界",
                "count": -2147483648,
                "urgent": True,
                "quiet": False,
                "abcdefghij0123456789": "twenty",
            },
        ),
        new_event(INTEROP_TYPE, "/outboxkit/relay", "plain text ✓", id="text"),
        new_event(INTEROP_TYPE, "/outboxkit/relay", b"\x00\xff\x10", id="bytes", partitionkey="b"),
        new_event(INTEROP_TYPE, "/outboxkit/relay", None, id="no-data"),
        new_event(
            INTEROP_TYPE, "/outboxkit/relay", [1, 2], id="no-key", datacontenttype="text/json"
        ),
    ]


async def test_relay_records_decode_in_the_java_sdk_with_every_attribute_equal(
    sqlite_url: str, kafka_bootstrap: str, topic: str, java_sdk: JavaSDK
) -> None:
    events = relay_events()
    write_events(sqlite_url, topic, events)
    kafka = KafkaSettings(bootstrap=kafka_bootstrap)
    relay = Relay(db_url=sqlite_url, kafka=kafka, options=FAST)
    assert await relay.drain(timeout_s=scaled(60)) == len(events)

    raw = {
        dict(r.headers)["ce_id"].decode(): r for r in await read_topic(kafka_bootstrap, topic, 5)
    }
    # Binding 3.2.2: no data is a null value, and no data has no content type.
    assert raw["no-data"].value is None
    assert "content-type" not in dict(raw["no-data"].headers)

    decoded = {
        line["attributes"]["id"]: line for line in java_sdk.consume(kafka_bootstrap, topic, 5)
    }
    assert sorted(decoded) == sorted(event.get_id() for event in events)
    for event in events:
        java = decoded[event.get_id()]
        sent = event.get_attributes()
        context = {name: sent[name] for name in CONTEXT if name in sent}
        java_context = dict(java["attributes"])
        assert datetime.fromisoformat(java_context.pop("time")) == context.pop("time")
        assert java_context == {name: canonical(value) for name, value in context.items()}
        # Binary mode has no types: the Java SDK reads every extension as its string.
        extensions = {name: value for name, value in sent.items() if name not in CONTEXT}
        assert java["extensions"] == {
            name: {"type": "String", "value": canonical(value)}
            for name, value in extensions.items()
        }
        encoded = encode_binary(event)
        assert java["key"] == (
            None if encoded.key is None else base64.b64encode(encoded.key).decode()
        )
        assert java["data_base64"] == (
            base64.b64encode(encoded.payload).decode() if encoded.payload else None
        )
        # Kafka clients never hand a null value to a deserializer; only that event needs the
        # SDK's own reader (which the deserializer wraps).
        assert java["reader"] == (
            "KafkaMessageFactory" if event.get_id() == "no-data" else "CloudEventDeserializer"
        )


# 2. Java SDK -> outboxkit ConsumerApp ------------------------------------------------------------


def java_events(mode: str) -> list[dict[str, Any]]:
    """The events the Java side publishes in ``mode``; ids say what each one checks."""

    def attributes(name: str, **optional: str) -> dict[str, str]:
        return {"id": f"{mode}-{name}", "source": "/java/sdk", "type": INTEROP_TYPE, **optional}

    return [
        java_event(
            mode,
            attributes(
                "full",
                time="2024-02-29T23:59:58.123456-07:00",
                subject="orders/ünïcödé",
                dataschema="https://schemas.example.com/order/1",
                datacontenttype="application/json",
            ),
            {
                "partitionkey": ("String", "pk-attribute"),
                "tenant": ("String", "Grüße 世界"),
                "count": ("Integer", "-2147483648"),
                "urgent": ("Boolean", "true"),
                "abcdefghij0123456789": ("String", "twenty"),
            },
            b'{"order":7,"items":["a","b"]}',
            key=b"user-key-92",  # must not overwrite partitionkey
        ),
        java_event(
            mode,
            attributes("text", datacontenttype="text/plain; charset=utf-8"),
            data="hello ✓".encode(),
            key=b"user-key-90",  # must not become a partitionkey
        ),
        java_event(
            mode,
            attributes("bytes", datacontenttype="application/octet-stream"),
            {"quiet": ("Boolean", "false")},
            b"\x00\xff\x10",
        ),
        java_event(mode, attributes("bare")),  # no data, no time, no key
    ]


def expected_event(mode: str, spec: dict[str, Any]) -> dict[str, Any]:
    """What a handler must see for ``spec``: its attributes, data and key, and nothing else.

    Structured mode keeps the JSON types of Integer and Boolean extensions; binary mode has
    only strings. Data is parsed for JSON, ``str`` for ``text/*``, else ``bytes``.
    """
    attributes: dict[str, Any] = {"specversion": "1.0", **spec["attributes"]}
    if "time" in attributes:
        attributes["time"] = datetime.fromisoformat(attributes["time"])
    for name, typed in spec["extensions"].items():
        value: Any = typed["value"]
        if mode == "structured" and typed["type"] == "Integer":
            value = int(value)
        elif mode == "structured" and typed["type"] == "Boolean":
            value = value == "true"
        attributes[name] = value
    raw = None if spec["data_base64"] is None else base64.b64decode(spec["data_base64"])
    content_type = attributes.get("datacontenttype", "")
    data: Any = raw
    if raw is not None and content_type.endswith("json"):
        data = json.loads(raw)
    elif raw is not None and content_type.startswith("text/"):
        data = raw.decode("utf-8")
    key = None if spec["key"] is None else base64.b64decode(spec["key"])
    return {"attributes": attributes, "data": data, "key": key}


async def test_java_sdk_events_are_applied_once_with_every_attribute_equal(
    sqlite_url: str, kafka_bootstrap: str, topic: str, java_sdk: JavaSDK
) -> None:
    create_effects_table(sqlite_url)
    await create_topic(kafka_bootstrap, topic)
    specs = {mode: java_events(mode) for mode in ("binary", "structured")}
    sent = [*specs["binary"], *specs["structured"]]
    redelivered = [specs["binary"][0], specs["structured"][0]]
    java_sdk.produce(kafka_bootstrap, topic, [*sent, *redelivered])

    seen: dict[str, dict[str, Any]] = {}
    app = ConsumerApp(name=f"interop-{uuid.uuid4().hex[:8]}", retention_interval_s=None)

    @app.handler(INTEROP_TYPE, topic=topic)
    async def apply(event: CloudEvent, record: KafkaRecord, session: AsyncSession) -> None:
        seen[event.get_id()] = {
            "attributes": dict(event.get_attributes()),
            "data": event.get_data(),
            "key": record.key,
        }
        await session.execute(
            insert(consumer_effects).values(
                consumer=app.name,
                source=event.get_source(),
                event_id=event.get_id(),
                n=record.offset,
                pid=0,
            )
        )

    async with running(app, sqlite_url, kafka_bootstrap) as (runtime, task):

        def settled() -> tuple[int, int]:
            alive(task)
            return runtime.stats.applied, runtime.stats.duplicates

        await wait_for(settled, lambda s: s == (len(sent), 2), 60, "all applied, 2 skipped")

    rows = effect_rows(sqlite_url)
    assert sorted(row.event_id for row in rows) == sorted(s["attributes"]["id"] for s in sent)
    for mode, mode_specs in specs.items():
        for spec in mode_specs:
            event_id = spec["attributes"]["id"]
            assert seen[event_id] == expected_event(mode, spec), event_id
    # The three binding rules the Python SDK alone gets wrong, spelled out:
    for mode in specs:
        assert seen[f"{mode}-full"]["attributes"]["partitionkey"] == "pk-attribute"
        assert "partitionkey" not in seen[f"{mode}-text"]["attributes"]
        assert "time" not in seen[f"{mode}-bare"]["attributes"]
        assert seen[f"{mode}-text"]["data"] == "hello ✓"  # text/* is str, data_base64 or not
