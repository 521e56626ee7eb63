"""``outboxkit dlq`` on a dead-letter topic filled by the real consumer runtime.

Two consumers read one topic. ``billing`` applies every order. ``shipping`` rejects three orders
for good (``PermanentError``), cannot validate two payments (pydantic) and, like billing, cannot
decode one malformed record: its dead-letter topic holds six records of three error kinds. The
three rejected orders were in fact applied by billing before shipping dead-lettered them, so a
replay to the original topic must not apply them twice there.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

import pytest
from aiokafka import TopicPartition
from cloudevents.core.v1.event import CloudEvent
from outboxkit.consumers import ConsumerApp, dlq_headers
from outboxkit.ops.dlq.tables import dlq_replays
from outboxkit.outbox import PermanentError, RetryPolicy, new_event
from outboxkit.outbox.backoff import Backoff
from outboxkit.outbox.db import make_engine
from outboxkit.testing.kafka import create_topic
from outboxkit.testing.postgres import throwaway_database
from pydantic import BaseModel
from sqlalchemy import insert, select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.pool import NullPool

from tests.support.consumer_apps import consumer_effects
from tests.support.consumers import (
    RawRecord,
    alive,
    binary_record,
    committed_offsets,
    create_effects_table,
    effect_rows,
    produce,
    running,
)
from tests.support.kafka import read_topic, wait_for
from tests.support.ops import cli, end_offsets

FAST_RETRY = RetryPolicy(max_attempts=2, backoff=Backoff(base_s=0.01, cap_s=0.05), max_elapsed_s=10)
REJECTED = (101, 102, 103)
ACCEPTED = 104
INPUT_RECORDS = 7  # four orders, two payments, one malformed record


class OrderRejected(PermanentError):
    """Shipping refuses the order for good."""


class Order(BaseModel):
    n: int


class Payment(BaseModel):
    amount: int


async def _effect(session: AsyncSession, consumer: str, event: CloudEvent, n: int) -> None:
    await session.execute(
        insert(consumer_effects).values(
            consumer=consumer, source=event.get_source(), event_id=event.get_id(), n=n, pid=0
        )
    )


def billing_app(topic: str) -> ConsumerApp:
    """Applies every order; has no handler for payments (skipped)."""
    app = ConsumerApp(
        name="billing", dlq_topic="{topic}.billing.dlq", retry=FAST_RETRY, retention_interval_s=None
    )

    @app.handler("order.placed", topic=topic)
    async def bill(order: Order, event: CloudEvent, session: AsyncSession) -> None:
        await _effect(session, "billing", event, order.n)

    return app


def shipping_app(topic: str, *, fixed: bool) -> ConsumerApp:
    """Rejects the orders of REJECTED until fixed; payments need an integer amount."""
    app = ConsumerApp(name="shipping", retry=FAST_RETRY, retention_interval_s=None)

    @app.handler("order.placed", topic=topic)
    async def ship(order: Order, event: CloudEvent, session: AsyncSession) -> None:
        if not fixed and order.n in REJECTED:
            raise OrderRejected(f"order {order.n} exceeds credit limit 500")
        await _effect(session, "shipping", event, order.n)

    @app.handler("order.paid", topic=topic)
    async def paid(payment: Payment, event: CloudEvent, session: AsyncSession) -> None:
        await _effect(session, "shipping", event, payment.amount)

    return app


def order(n: int) -> CloudEvent:
    return new_event("order.placed", "/shop", {"n": n}, id=f"order-{n}", partitionkey=f"o-{n}")


def payment(i: int) -> CloudEvent:
    return new_event(
        "order.paid", "/payments", {"amount": "lots"}, id=f"pay-{i}", partitionkey=f"p-{i}"
    )


@dataclass(frozen=True)
class Scenario:
    topic: str
    dlq: str
    db_url: str
    bootstrap: str
    billing_group: str
    shipping_group: str
    records: list[RawRecord]

    async def run_consumers(self, *, shipping: int, billing_duplicates: int, end: int) -> None:
        """Run billing and a fixed shipping until they handled what was replayed."""
        async with (
            running(
                billing_app(self.topic), self.db_url, self.bootstrap, group=self.billing_group
            ) as (billing, billing_task),
            running(
                shipping_app(self.topic, fixed=True),
                self.db_url,
                self.bootstrap,
                group=self.shipping_group,
            ) as (shipper, shipping_task),
        ):
            await wait_for(
                lambda: (
                    alive(billing_task)
                    or alive(shipping_task)
                    or (
                        shipper.stats.applied + shipper.stats.duplicates,
                        billing.stats.duplicates,
                    )
                ),
                lambda seen: seen == (shipping, billing_duplicates),
                60,
                "the replayed records handled by both consumers",
            )
            await self.wait_committed(end)
        assert billing.stats.applied == 0 and billing.stats.dead_lettered == 0
        assert shipper.stats.dead_lettered == 0

    async def wait_committed(self, end: int) -> None:
        tp = TopicPartition(self.topic, 0)
        for group in (self.billing_group, self.shipping_group):
            await wait_for(
                lambda group=group: committed_offsets(self.bootstrap, group),
                lambda committed: committed.get(tp) == end,
                30,
                f"offsets of {group} committed up to {end}",
            )


@pytest.fixture(scope="module")
def ops_db() -> Iterator[str]:
    # One database for the module: the scenario is shared by its tests (pg_url is per test).
    with throwaway_database("outboxkit_test") as url:
        create_effects_table(url)
        yield url


@pytest.fixture(scope="module")
async def scenario(ops_db: str, kafka_bootstrap: str) -> AsyncIterator[Scenario]:
    topic = f"ops-{uuid.uuid4().hex[:10]}"
    await create_topic(kafka_bootstrap, topic)
    await create_topic(kafka_bootstrap, f"{topic}.dlq")
    key, _, headers = binary_record(order(900))
    records = [binary_record(order(n)) for n in (*REJECTED, ACCEPTED)]
    records += [binary_record(payment(i)) for i in (1, 2)]
    records.append((key, b'{"n": 9', headers))  # invalid JSON: no consumer can decode it
    assert len(records) == INPUT_RECORDS
    await produce(kafka_bootstrap, topic, records)
    run = Scenario(
        topic=topic,
        dlq=f"{topic}.dlq",
        db_url=ops_db,
        bootstrap=kafka_bootstrap,
        billing_group=f"billing-{uuid.uuid4().hex[:6]}",
        shipping_group=f"shipping-{uuid.uuid4().hex[:6]}",
        records=records,
    )
    async with (
        running(billing_app(topic), ops_db, kafka_bootstrap, group=run.billing_group) as (
            billing,
            billing_task,
        ),
        running(
            shipping_app(topic, fixed=False), ops_db, kafka_bootstrap, group=run.shipping_group
        ) as (shipper, shipping_task),
    ):
        await wait_for(
            lambda: (
                alive(billing_task)
                or alive(shipping_task)
                or (
                    billing.stats.applied + billing.stats.dead_lettered + billing.stats.unhandled,
                    shipper.stats.applied + shipper.stats.dead_lettered,
                )
            ),
            lambda seen: seen == (INPUT_RECORDS, INPUT_RECORDS),
            60,
            "both consumers through the input",
        )
        await run.wait_committed(INPUT_RECORDS)
    assert (billing.stats.applied, billing.stats.dead_lettered) == (4, 1)
    assert (shipper.stats.applied, shipper.stats.dead_lettered) == (1, 6)
    yield run


def effects(db_url: str) -> Counter[tuple[str, str]]:
    return Counter((row.consumer, row.event_id) for row in effect_rows(db_url))


async def listing(scenario: Scenario, *filters: str) -> list[dict]:
    result = await cli(
        "dlq", "list", scenario.dlq, "--json", "--bootstrap", scenario.bootstrap, *filters
    )
    assert result.code == 0, result.err
    document = result.json()
    assert document["matched"] == len(document["records"])
    return document["records"]


def iso(epoch_ms: int) -> str:
    return datetime.fromtimestamp(epoch_ms / 1000, UTC).isoformat(timespec="milliseconds")


async def test_filters_give_exact_counts(scenario: Scenario) -> None:
    everything = await listing(scenario)
    assert len(everything) == 6
    by_class = Counter(r["error_class"] for r in everything)
    assert by_class == {
        "permanent:OrderRejected": 3,
        "permanent:ValidationError": 2,
        "permanent:InvalidJSONError": 1,
    }
    rejected = [r for r in everything if r["error_class"] == "permanent:OrderRejected"]
    assert sorted(r["id"] for r in rejected) == ["order-101", "order-102", "order-103"]
    assert {r["original_topic"] for r in everything} == {scenario.topic}
    assert {r["consumer_group"] for r in everything} == {scenario.shipping_group}
    assert all(r["attempts"] == 1 for r in everything)

    async def count(*filters: str) -> int:
        return len(await listing(scenario, *filters))

    assert await count("--type", "order.placed") == 4  # three rejected, one malformed
    assert await count("--type", "order.paid") == 2
    assert await count("--type", "order.paid", "--type", "order.placed") == 6
    assert await count("--source", "/payments") == 2
    assert await count("--error-class", "permanent:OrderRejected") == 3
    assert await count("--error-class", "ValidationError") == 2
    assert await count("--error-class", "InvalidJSONError") == 1
    assert await count("--error-class", "permanent") == 6
    assert await count("--error-class", "exhausted") == 0
    assert await count("--type", "order.placed", "--error-class", "OrderRejected") == 3
    assert await count("--type", "no.such.type") == 0

    offsets = sorted(r["offset"] for r in everything)
    assert offsets == list(range(6))
    assert await count("--from-offset", "2") == 4
    assert await count("--to-offset", "1") == 2
    assert await count("--from-offset", "1", "--to-offset", "3") == 3
    assert await count("--partition", "0", "--from-offset", "5") == 1
    expected = sum(
        1
        for r in everything
        if 1 <= r["offset"] <= 4 and r["error_class"] == "permanent:ValidationError"
    )
    assert (
        await count("--from-offset", "1", "--to-offset", "4", "--error-class", "ValidationError")
        == expected
    )

    stamps = sorted(r["timestamp_ms"] for r in everything)
    assert await count("--since", "1h") == 6
    assert await count("--until", "1h") == 0
    assert await count("--since", iso(stamps[-1] + 1)) == 0
    assert await count("--until", iso(stamps[0] - 1)) == 0
    middle = stamps[len(stamps) // 2]
    assert await count("--since", iso(middle)) == sum(1 for s in stamps if s >= middle)
    assert await count("--until", iso(middle)) == sum(1 for s in stamps if s <= middle)
    assert await count("--since", iso(stamps[0]), "--until", iso(stamps[-1])) == 6


async def test_grouped_view_counts_failures_per_cause(scenario: Scenario) -> None:
    result = await cli(
        "dlq", "list", scenario.dlq, "--group", "--json", "--bootstrap", scenario.bootstrap
    )
    assert result.code == 0, result.err
    groups = result.json()["groups"]
    summary = {(g["error_class"], g["pattern"]): g["count"] for g in groups}
    validation = next(g["pattern"] for g in groups if g["error_class"].endswith("ValidationError"))
    assert summary == {
        ("permanent:OrderRejected", "order <num> exceeds credit limit <num>"): 3,
        ("permanent:ValidationError", validation): 2,
        ("permanent:InvalidJSONError", "data is not valid JSON for its content type"): 1,
    }
    assert "Payment" in validation and "lots" not in validation
    assert [g["count"] for g in groups] == [3, 2, 1]  # most frequent cause first
    assert all(g["original_topics"] == [scenario.topic] for g in groups)
    filtered = await cli(
        "dlq", "list", scenario.dlq, "--group", "--json", "--type", "order.placed",
        "--bootstrap", scenario.bootstrap,
    )  # fmt: skip
    assert {g["error_class"]: g["count"] for g in filtered.json()["groups"]} == {
        "permanent:OrderRejected": 3,
        "permanent:InvalidJSONError": 1,
    }
    table = await cli("dlq", "list", scenario.dlq, "--group", "--bootstrap", scenario.bootstrap)
    assert table.code == 0
    assert "order <num> exceeds credit limit <num>" in table.out
    assert "6 record(s), 3 cause(s)" in table.out


async def test_show_decodes_headers_and_caps_the_data(scenario: Scenario) -> None:
    everything = await listing(scenario, "--error-class", "OrderRejected")
    offset = str(everything[0]["offset"])
    shown = await cli("dlq", "show", scenario.dlq, offset, "--bootstrap", scenario.bootstrap)
    assert shown.code == 0, shown.err
    assert "outboxkit-error-class: permanent:OrderRejected" in shown.out
    assert f"outboxkit-original-topic: {scenario.topic}" in shown.out
    assert "ce_type: order.placed" in shown.out
    assert '"n": 101' in shown.out  # pretty-printed JSON data
    document = (
        await cli("dlq", "show", scenario.dlq, offset, "--json", "--bootstrap", scenario.bootstrap)
    ).json()
    assert document["id"] == "order-101" and document["key"] == "o-101"
    assert document["data"] == '{\n  "n": 101\n}' and not document["data_truncated"]
    paid = (await listing(scenario, "--type", "order.paid"))[0]
    capped = await cli(
        "dlq", "show", scenario.dlq, str(paid["offset"]), "--json", "--max-bytes", "16",
        "--bootstrap", scenario.bootstrap,
    )  # fmt: skip
    assert capped.json()["data"] == '{\n  "amount": "l'  # 16 of the 22 bytes of its rendering
    assert capped.json()["data_truncated"] is True
    capped_text = await cli(
        "dlq", "show", scenario.dlq, str(paid["offset"]), "--max-bytes", "16",
        "--bootstrap", scenario.bootstrap,
    )  # fmt: skip
    assert "truncated" in capped_text.out and "lots" not in capped_text.out
    malformed = (await listing(scenario, "--error-class", "InvalidJSONError"))[0]
    raw = await cli(
        "dlq", "show", scenario.dlq, str(malformed["offset"]), "--bootstrap", scenario.bootstrap
    )
    assert '{"n": 9' in raw.out  # invalid JSON is shown as the text it is


async def test_replay_republishes_originals_once_and_inboxes_absorb_applied_events(
    scenario: Scenario,
) -> None:
    run = scenario
    common = ("--bootstrap", run.bootstrap, "--db-url", run.db_url)
    before = effects(run.db_url)
    assert before == {
        **{("billing", f"order-{n}"): 1 for n in (*REJECTED, ACCEPTED)},
        ("shipping", f"order-{ACCEPTED}"): 1,
    }

    dry = await cli(
        "dlq", "replay", run.dlq, "--error-class", "OrderRejected", "--dry-run", "--json", *common
    )
    assert dry.code == 0, dry.err
    assert dry.json()["replayed"] == 3 and dry.json()["dry_run"] is True
    assert {r["status"] for r in dry.json()["records"]} == {"would replay"}
    assert await end_offsets(run.bootstrap, run.topic) == [INPUT_RECORDS]  # nothing published

    first = await cli(
        "dlq",
        "replay",
        run.dlq,
        "--error-class",
        "OrderRejected",
        "--by",
        "tester",
        "--json",
        *common,
    )
    assert first.code == 0, first.err
    assert first.json()["replayed"] == 3
    assert first.json()["by_target"] == {run.topic: 3}
    assert await end_offsets(run.bootstrap, run.topic) == [INPUT_RECORDS + 3]
    republished = [
        r
        for r in await read_topic(run.bootstrap, run.topic, INPUT_RECORDS + 3)
        if r.offset >= INPUT_RECORDS
    ]
    originals = {record[0]: record for record in run.records[: len(REJECTED)]}
    assert len(republished) == 3
    for record in republished:
        _, value, headers = originals[record.key]
        assert record.value == value
        assert list(record.headers) == list(headers)  # the CloudEvent, no dead-letter headers
        assert not any(name in dlq_headers.ALL for name, _ in record.headers)
    ledger = ledger_rows(run.db_url)
    assert {(row.target_topic, row.replayed_by) for row in ledger} == {(run.topic, "tester")}
    assert len(ledger) == 3 and len({row.replay_id for row in ledger}) == 1

    # Shipping is fixed: it applies the three orders once; billing had applied them before
    # they were dead-lettered, and its inbox skips them.
    await run.run_consumers(shipping=3, billing_duplicates=3, end=INPUT_RECORDS + 3)
    applied_once = {
        **{("billing", f"order-{n}"): 1 for n in (*REJECTED, ACCEPTED)},
        **{("shipping", f"order-{n}"): 1 for n in (*REJECTED, ACCEPTED)},
    }
    assert effects(run.db_url) == applied_once

    again = await cli("dlq", "replay", run.dlq, "--error-class", "OrderRejected", "--json", *common)
    assert again.code == 0, again.err
    assert (again.json()["replayed"], again.json()["skipped_already_replayed"]) == (0, 3)
    assert await end_offsets(run.bootstrap, run.topic) == [INPUT_RECORDS + 3]  # no second publish
    plain = await cli("dlq", "replay", run.dlq, "--error-class", "OrderRejected", *common)
    assert "0 replayed, 3 skipped as already replayed" in plain.out

    forced = await cli(
        "dlq", "replay", run.dlq, "--error-class", "OrderRejected", "--force", "--json", *common
    )
    assert forced.json()["replayed"] == 3
    assert await end_offsets(run.bootstrap, run.topic) == [INPUT_RECORDS + 6]
    await run.run_consumers(shipping=3, billing_duplicates=3, end=INPUT_RECORDS + 6)
    assert effects(run.db_url) == applied_once  # a forced replay is absorbed by the inboxes
    assert len(ledger_rows(run.db_url)) == 3  # one row per record and target: the latest replay

    retry_topic = f"{run.topic}.retry"
    missing = await cli(
        "dlq", "replay", run.dlq, "--type", "order.paid", "--to", retry_topic, *common
    )
    assert missing.code == 2
    assert "does not exist" in missing.error_line()
    await create_topic(run.bootstrap, retry_topic)
    moved = await cli(
        "dlq", "replay", run.dlq, "--type", "order.paid", "--to", retry_topic, "--rate", "4",
        "--json", *common,
    )  # fmt: skip
    assert moved.json()["by_target"] == {retry_topic: 2}
    assert moved.seconds >= 0.25  # the second record waited for its turn at 4 records/s
    copies = await read_topic(run.bootstrap, retry_topic, 2)
    assert sorted(dict(r.headers)["ce_id"] for r in copies) == [b"pay-1", b"pay-2"]
    assert len(ledger_rows(run.db_url)) == 5
    assert await end_offsets(run.bootstrap, run.topic) == [INPUT_RECORDS + 6]


def ledger_rows(db_url: str) -> list:
    engine = make_engine(db_url, poolclass=NullPool)
    with engine.connect() as connection:
        rows = connection.execute(select(dlq_replays).order_by(dlq_replays.c.id)).all()
    engine.dispose()
    return list(rows)
