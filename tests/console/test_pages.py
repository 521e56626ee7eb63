"""The console's outbox, inbox and audit pages over real HTTP on real PostgreSQL: requeue with
the count confirmed first, keyset pages, the inbox look-up."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator

import pytest
from outboxkit.console import ConsoleConfig
from outboxkit.consumers.tables import inbox_events
from outboxkit.outbox import Outbox, new_event
from outboxkit.outbox.db import make_engine
from outboxkit.outbox.kafka_settings import KafkaSettings
from outboxkit.outbox.tables import outbox_events
from sqlalchemy import func, insert, select, update
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from tests.support.console import OPERATOR_TOKEN, TOKENS, csrf_of, serving, signed_in


@pytest.fixture
def console_url(pg_url: str, kafka_bootstrap: str) -> Iterator[str]:
    config = ConsoleConfig(
        db_url=pg_url, kafka=KafkaSettings(bootstrap=kafka_bootstrap), tokens=TOKENS, page_size=4
    )
    with serving(config) as base:
        yield base


def parked_rows(db_url: str, topics: dict[str, int]) -> None:
    engine = make_engine(db_url, poolclass=NullPool)
    with Session(engine) as session, session.begin():
        for topic, n in topics.items():
            for _ in range(n):
                Outbox(default_topic=topic).add(session, new_event("order.placed", "/shop", {}))
    with engine.begin() as connection:
        connection.execute(
            update(outbox_events).values(parked_ms=int(time.time() * 1000), last_error="boom")
        )
    engine.dispose()


def count_parked(db_url: str) -> int:
    engine = make_engine(db_url, poolclass=NullPool)
    with engine.connect() as connection:
        found = connection.scalar(
            select(func.count()).where(outbox_events.c.parked_ms.is_not(None))
        )
    engine.dispose()
    return int(found or 0)


def test_requeue_a_filter_shows_the_count_first_then_requeues_and_audits(
    console_url: str, pg_url: str
) -> None:
    parked_rows(pg_url, {"orders": 3, "payments": 2})
    with signed_in(console_url, OPERATOR_TOKEN) as client:
        page = client.get("/outbox?which=parked&topic=orders").text
        assert "Outbox: 3 parked row(s)" in page
        asked = client.post(
            "/outbox/requeue", data={"csrf": csrf_of(page), "scope": "filter", "topic": "orders"}
        )
        assert "3 parked row(s) would be requeued" in asked.text
        assert count_parked(pg_url) == 5  # counting changed nothing
        done = client.post(
            "/outbox/requeue",
            data={
                "csrf": csrf_of(page), "scope": "filter", "topic": "orders", "step": "confirm",
                "expected": "3",
            },
        )  # fmt: skip
        assert done.status_code == 400 and "a reason is required" in done.text
        assert count_parked(pg_url) == 5
        done = client.post(
            "/outbox/requeue",
            data={
                "csrf": csrf_of(page), "scope": "filter", "topic": "orders", "step": "confirm",
                "expected": "3", "reason": "the schema registry is back",
            },
        )  # fmt: skip
        assert "requeued 3 row(s)" in done.text
        assert count_parked(pg_url) == 2
        audit = client.get("/audit").text
        assert "outbox.requeue" in audit and "the schema registry is back" in audit
        assert re.search(r"<td>3</td><td>the schema registry is back</td>", audit)


def test_pending_rows_are_paged_by_keyset(console_url: str, pg_url: str) -> None:
    engine = make_engine(pg_url, poolclass=NullPool)
    with Session(engine) as session, session.begin():
        for _ in range(10):
            Outbox(default_topic="orders").add(session, new_event("order.placed", "/shop", {}))
    with engine.connect() as connection:
        ids = sorted(connection.scalars(select(outbox_events.c.id)))
    engine.dispose()
    seen: list[int] = []
    with signed_in(console_url, OPERATOR_TOKEN) as client:
        url: str | None = "/outbox?which=pending"
        while url is not None:
            page = client.get(url).text
            seen += [int(i) for i in re.findall(r"<tr>\s*<td>(\d+)</td>", page)]
            found = re.search(r'id="next" href="([^"]+)"', page)
            url = found.group(1).replace("&amp;", "&") if found else None
    assert seen == ids


def test_the_inbox_look_up_says_who_applied_an_event_or_not_seen(
    console_url: str, pg_url: str
) -> None:
    engine = make_engine(pg_url, poolclass=NullPool)
    with engine.begin() as connection:
        connection.execute(
            insert(inbox_events).values(
                consumer="billing", source="/shop", event_id="o-1", processed_ms=1_700_000_000_000
            )
        )
    engine.dispose()
    with signed_in(console_url, OPERATOR_TOKEN) as client:
        page = client.get("/inbox", params={"source": "/shop", "id": "o-1"}).text
        assert "<td>billing</td><td>2023-11-14 22:13:20Z</td>" in page
        page = client.get("/inbox", params={"source": "/shop", "id": "o-2"}).text
        assert "not seen by any consumer" in page


async def test_a_capped_count_stops_at_its_cap(pg_url: str) -> None:
    from outboxkit.ops.outbox_rows import count_rows
    from outboxkit.outbox.db import make_async_engine

    parked_rows(pg_url, {"orders": 5})
    engine = make_async_engine(pg_url)
    try:
        assert await count_rows(engine, which="parked") == 5
        assert await count_rows(engine, which="parked", at_most=3) == 3
        assert await count_rows(engine, which="parked", at_most=10) == 5
    finally:
        await engine.dispose()
