"""Poison records of the chaos run: records no handler can apply, written straight to Kafka.

One goes in after every 1,000 committed events, of five kinds in turn: not a CloudEvent,
invalid JSON, JSON nested past the parser's limit, data the model refuses, and invalid JSON of
about 1,048,000 bytes (too large for the broker once the dead-letter headers are added). Each
carries a ``chaos-poison`` header with its number, which its dead letter keeps, so the run can
check that every one was dead-lettered and none applied.
"""

from __future__ import annotations

import json

from aiokafka import AIOKafkaProducer

from tests.chaos.app import EVENT_TYPE

POISON_HEADER = "chaos-poison"
EVERY = 1000
KINDS = ("not-a-cloudevent", "invalid-json", "deep-json", "invalid-data", "near-limit")
NEAR_LIMIT = 1_048_000
DEEP = 100_000

Record = tuple[bytes, bytes, list[tuple[str, bytes]]]


def poison_record(number: int) -> Record:
    """Poison record ``number`` (its kind is ``KINDS[number % 5]``)."""
    kind = KINDS[number % len(KINDS)]
    mark = [(POISON_HEADER, str(number).encode())]
    ce = [
        ("ce_specversion", b"1.0"),
        ("ce_id", f"poison-{number}".encode()),
        ("ce_source", b"/chaos/poison"),
        ("ce_type", EVENT_TYPE.encode()),
        ("content-type", b"application/json"),
    ]
    key = f"poison-{number}".encode()
    if kind == "not-a-cloudevent":
        return key, b"\x00\xffnot an event", mark
    if kind == "invalid-json":
        return key, b'{"key": "poison", "seq": ', mark + ce
    if kind == "deep-json":
        return key, b"[" * DEEP + b"]" * DEEP, mark + ce
    if kind == "invalid-data":
        return key, json.dumps({"key": "poison", "seq": "not a number"}).encode(), mark + ce
    return key, b"{" + b"x" * (NEAR_LIMIT - 1), mark + ce


async def send_poison(bootstrap: str, topic: str, numbers: list[int]) -> None:
    """Write the poison records ``numbers`` to ``topic`` and wait for the broker's acks."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        enable_idempotence=True,
        max_request_size=1_048_588,
        request_timeout_ms=10_000,
    )
    await producer.start()
    try:
        for number in numbers:
            key, value, headers = poison_record(number)
            await (await producer.send(topic, value, key=key, headers=headers))
    finally:
        await producer.stop()
