"""Fuzzing one long-running consumer with Hypothesis-generated Kafka records.

Random headers and values, valid and broken CloudEvents in binary and structured mode, JSON
nested past the parser's limit, and a few records up to the broker's size limit all go through
ONE real consumer (real Kafka, real PostgreSQL). Whatever they are, each record must end either
applied or dead-lettered, the consumer must keep running, and its committed offsets must reach
the end of every partition. The examples are drawn first (no shrinking: the consumer is slow
compared with Hypothesis), so the seed is printed on failure to replay the same records.
"""

from __future__ import annotations

import json
import os
import random
from typing import Any

from aiokafka import AIOKafkaProducer, TopicPartition
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st
from outboxkit.consumers import dlq_headers
from outboxkit.testing.kafka import create_topic

from tests.support.consumer_apps import WIDGET_TYPE
from tests.support.consumers import (
    FAST_RETRY,
    RawRecord,
    alive,
    committed_offsets,
    create_effects_table,
    effect_rows,
    effects_app_for,
    running,
)
from tests.support.kafka import read_topic, wait_for

EXAMPLES = 80
PARTITIONS = 3
RECORD_LIMIT = 1_048_000  # key + value + headers, under the broker's 1,048,588 per batch
BIG_RECORDS = 3  # at most this many near the limit: a few MB in total
DEEP = 50_000

_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=20)
# Any other header: the decoder must ignore it, whatever its name or bytes.
_header = st.tuples(
    _text.filter(lambda name: name and not name.lower().startswith(("ce_", "content-type"))),
    st.one_of(st.none(), st.binary(max_size=200)),
)
_ce_header = st.tuples(
    st.sampled_from(
        ["ce_specversion", "ce_id", "ce_source", "ce_type", "ce_time", "ce_x", "content-type"]
    ),
    st.one_of(st.none(), st.binary(max_size=40), st.sampled_from([b"1.0", b"application/json"])),
)
_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | _text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_text, inner, max_size=4),
    max_leaves=12,
)
EXAMPLE = st.fixed_dictionaries(
    {
        # valid widgets twice as often as each kind of poison
        "shape": st.sampled_from(
            ["valid", "valid", "bad_data", "random_ce_headers", "random_value", "deep"]
        ),
        "mode": st.sampled_from(["binary", "structured"]),
        "n": st.integers(-(2**31), 2**31 - 1),
        "data": _json,
        "headers": st.lists(_header, max_size=4),
        "ce_headers": st.lists(_ce_header, max_size=6),
        "value": st.binary(max_size=300),
        "key": st.one_of(st.none(), st.binary(max_size=30)),
        "big": st.sampled_from([False] * 12 + [True]),
    }
)


def draw_examples(count: int, run_seed: int) -> list[dict[str, Any]]:
    """``count`` examples of :data:`EXAMPLE`, drawn by Hypothesis from ``run_seed``."""
    drawn: list[dict[str, Any]] = []

    @seed(run_seed)
    @settings(
        max_examples=count,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(EXAMPLE)
    def collect(example: dict[str, Any]) -> None:
        drawn.append(example)

    collect()
    return drawn[:count]


def to_record(index: int, example: dict[str, Any], big: bool) -> RawRecord:
    """The Kafka record of ``example``; ``big`` pads it up to :data:`RECORD_LIMIT`."""
    key, value, headers = _record(index, example, pad=0)
    if big:
        room = RECORD_LIMIT - len(key or b"") - len(value)
        room -= sum(len(name.encode()) + len(header or b"") + 8 for name, header in headers)
        if example["shape"] == "valid":
            key, value, headers = _record(index, example, pad=room - 12)  # still a widget
        else:
            value += b"x" * room  # broken JSON (or data), close to the limit
    return key, value, headers


def _record(index: int, example: dict[str, Any], pad: int) -> RawRecord:
    event_id = f"fuzz-{index}"  # unique: a valid record is applied, never a duplicate
    attributes = {"specversion": "1.0", "id": event_id, "source": "/fuzz", "type": WIDGET_TYPE}
    data: Any = {"n": example["n"], "pad": "x" * pad} if pad else {"n": example["n"]}
    if example["shape"] == "bad_data":
        data = example["data"]
    headers: list[tuple[str, bytes | None]] = list(example["headers"])
    structured = example["mode"] == "structured"
    shape = example["shape"]
    if shape == "random_ce_headers":
        return example["key"], example["value"], headers + example["ce_headers"]
    if shape == "random_value":
        value: bytes = example["value"]
    elif shape == "deep" and structured:
        envelope = json.dumps(attributes)[:-1].encode()
        value = envelope + b', "data": ' + b"[" * DEEP + b"]" * DEEP + b"}"
    elif shape == "deep":
        value = b"[" * DEEP + b"]" * DEEP
    elif structured:
        envelope = {**attributes, "datacontenttype": "application/json", "data": data}
        value = json.dumps(envelope).encode()
    else:
        value = json.dumps(data).encode()
    if structured:
        headers.append(("content-type", b"application/cloudevents+json"))
    else:
        headers += [(f"ce_{name}", text.encode()) for name, text in attributes.items()]
        headers.append(("content-type", b"application/json"))
    return example["key"], value, headers


async def produce_all(bootstrap: str, topic: str, records: list[RawRecord]) -> dict[int, int]:
    """Send ``records`` round-robin over the partitions; return the end offset of each."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, enable_idempotence=True, max_request_size=1_048_588
    )
    await producer.start()
    ends = dict.fromkeys(range(PARTITIONS), 0)
    try:
        futures = []
        for index, (key, value, headers) in enumerate(records):
            partition = index % PARTITIONS
            futures.append(
                await producer.send(topic, value, key=key, headers=headers, partition=partition)
            )
            ends[partition] += 1
        for future in futures:
            await future
    finally:
        await producer.stop()
    return ends


async def test_every_fuzzed_record_is_applied_or_dead_lettered_and_the_consumer_goes_on(
    pg_url: str, kafka_bootstrap: str, topic: str
) -> None:
    run_seed = int(os.environ.get("OUTBOXKIT_FUZZ_SEED") or random.randrange(2**32))
    examples = draw_examples(EXAMPLES, run_seed)
    bigs = [i for i, example in enumerate(examples) if example["big"]][:BIG_RECORDS]
    records = [to_record(i, example, i in bigs) for i, example in enumerate(examples)]
    create_effects_table(pg_url)
    await create_topic(kafka_bootstrap, topic, partitions=PARTITIONS)
    app = effects_app_for(topic, retry=FAST_RETRY, unhandled="dead-letter")
    where = f"(OUTBOXKIT_FUZZ_SEED={run_seed})"
    async with running(app, pg_url, kafka_bootstrap) as (runtime, task):
        ends = await produce_all(kafka_bootstrap, topic, records)
        expected = {TopicPartition(topic, p): end for p, end in ends.items() if end}
        await wait_for(
            lambda: committed_offsets(kafka_bootstrap, runtime.group),
            lambda offsets: alive(task) or offsets == expected,
            90,
            f"committed offsets at the end of every partition {where}",
        )
        alive(task)
    stats = runtime.stats
    size = sum(len(value or b"") for _, value, _ in records)
    print(f"\nfuzz {where}: {len(records)} records, {size} bytes, {stats}")
    assert stats.applied + stats.dead_lettered == len(records), (stats, where)
    applied = {row.event_id for row in effect_rows(pg_url)}
    assert len(applied) == len(effect_rows(pg_url)) == stats.applied, where
    letters = await read_topic(
        kafka_bootstrap, f"{topic}.dlq", expected=stats.dead_lettered, timeout=60
    )
    origins = {
        (texts[dlq_headers.ORIGINAL_PARTITION], texts[dlq_headers.ORIGINAL_OFFSET])
        for texts in (dlq_headers.header_texts(letter.headers) for letter in letters)
    }
    assert len(origins) == stats.dead_lettered, where
    # Every valid widget was applied; every record is accounted for once.
    valid = {f"fuzz-{i}" for i, e in enumerate(examples) if e["shape"] == "valid"}
    assert valid <= applied, (sorted(valid - applied), where)
    assert len(applied) + len(origins) == len(records), where
