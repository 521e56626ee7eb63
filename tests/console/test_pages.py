"""The console's outbox, dead-letter, workflow, inbox and audit pages over real HTTP on real
PostgreSQL and Kafka: requeue and discard with the count confirmed first, keyset pages (and the
index the workflow list is read along), the inbox look-up."""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections.abc import Iterator

import pytest
from outboxkit.console import ConsoleConfig
from outboxkit.consumers.tables import inbox_events
from outboxkit.ops.dlq.fingerprint import fingerprint_id
from outboxkit.ops.dlq.tables import dlq_discards
from outboxkit.outbox import Outbox, new_event
from outboxkit.outbox.db import make_engine
from outboxkit.outbox.kafka_settings import KafkaSettings
from outboxkit.outbox.tables import outbox_events
from outboxkit.workflows.store import instances_query
from outboxkit.workflows.tables import workflow_instances
from sqlalchemy import func, insert, select, text, update
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from tests.ops.test_slot_gaps import write_gaps
from tests.support import workflow_ops as w
from tests.support.console import (
    OPERATOR_TOKEN,
    TOKENS,
    VIEWER_TOKEN,
    csrf_of,
    follow_pages,
    serving,
    signed_in,
)
from tests.support.consumers import dead_letters_of_two_causes
from tests.support.ops import cli_process
from tests.support.waits import scaled


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
        for page in follow_pages(client, "/outbox?which=pending"):
            seen += [int(i) for i in re.findall(r"<tr>\s*<td>(\d+)</td>", page)]
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


def test_discard_a_group_counts_first_asks_a_reason_hides_it_and_replay_skips_it(
    console_url: str, pg_url: str, kafka_bootstrap: str
) -> None:
    dlq = asyncio.run(dead_letters_of_two_causes(kafka_bootstrap, f"pages-{uuid.uuid4().hex[:8]}"))
    timeouts = fingerprint_id("exhausted:Timeout", "order 10 exceeds the limit")
    with signed_in(console_url, OPERATOR_TOKEN) as client:
        page = client.get(f"/dlq/{dlq}").text
        assert 'id="discard-' + timeouts + '"' in page
        form = {"csrf": csrf_of(page), "fingerprint": timeouts}
        asked = client.post(f"/dlq/{dlq}/discard", data=form).text
        assert "<strong>2</strong> letter(s) would be discarded" in asked
        assert discards(pg_url) == 0  # counting changed nothing
        confirm = {**form, "step": "confirm", "expected": "2"}
        assert client.post(f"/dlq/{dlq}/discard", data=confirm).status_code == 400  # no reason
        assert discards(pg_url) == 0
        done = client.post(f"/dlq/{dlq}/discard", data={**confirm, "reason": "re-entered"})
        assert "2 discarded, 0 already discarded" in done.text
        assert discards(pg_url) == 2
        # the overview and the topics page count the letters left to handle, and the discarded
        live = client.get("/overview/live").text
        assert re.search(
            rf'{dlq}</a></td>\s*<td><a class="dlq-count"[^>]*>4</a></td>\s*'
            r'<td class="dlq-discarded">2</td>',
            live,
        ), live
        assert re.search(rf"{dlq}</a></td>\s*<td>4</td><td>2</td>", client.get("/dlq").text)
        audit = client.get("/audit").text
        assert re.search(r"dlq\.discard.*<td>2</td><td>re-entered</td>", audit, re.S)
        # left out of the list unless asked for; the letter itself still opens
        page = client.get(f"/dlq/{dlq}").text
        assert '<span id="matched">4</span>' in page
        assert "2 discarded letter(s) in this topic, left out" in page
        page = client.get(f"/dlq/{dlq}", params={"include_discarded": "1"}).text
        assert '<span id="matched">6</span>' in page
        letter = client.get(f"/dlq/{dlq}/0/4").text
        assert "by otto: re-entered" in letter and 'id="undiscard-letter"' in letter
        # a replay of everything counts the 4 others only
        asked = client.post(f"/dlq/{dlq}/replay", data={"csrf": form["csrf"]}).text
        assert "<strong>4</strong> record(s) would be replayed" in asked
        assert "2 discarded (skipped)" in asked
        # brought back one by one
        one = {"csrf": form["csrf"], "partition": "0", "offset": "4", "step": "confirm"}
        back = client.post(f"/dlq/{dlq}/undiscard", data={**one, "reason": "replay it"})
        assert "1 restored" in back.text and discards(pg_url) == 1
    with signed_in(console_url, VIEWER_TOKEN) as client:
        page = client.get(f"/dlq/{dlq}").text
        assert "button" not in page.split("<h2>By cause</h2>")[1].split("</table>")[0]
        refused = client.post(f"/dlq/{dlq}/discard", data={"csrf": csrf_of(page)})
        assert refused.status_code == 403 and "viewers cannot act" in refused.text


def discards(db_url: str) -> int:
    engine = make_engine(db_url, poolclass=NullPool)
    with engine.connect() as connection:
        found = connection.scalar(select(func.count()).select_from(dlq_discards))
    engine.dispose()
    return int(found or 0)


def test_the_workflow_list_is_paged_by_keyset_along_its_index(
    console_url: str, pg_url: str
) -> None:
    asyncio.run(w.start_many(pg_url, 10))
    engine = make_engine(pg_url, poolclass=NullPool)
    with engine.connect() as connection:
        expected = connection.execute(
            select(workflow_instances.c.workflow_id).order_by(
                workflow_instances.c.updated_ms.desc(), workflow_instances.c.id.desc()
            )
        ).scalars().all()  # fmt: skip
    seen: list[str] = []
    with signed_in(console_url, OPERATOR_TOKEN) as client:
        for page in follow_pages(client, "/workflows"):
            seen += re.findall(r'<a href="/workflows/acme/[^"]+">([^<]+)</a>', page)
    assert seen == expected and len(seen) == 10
    # With many instances, PostgreSQL reads a page backwards along ix_workflow_instances_updated
    # (no sort, no scan of the table), the first page and the following ones alike.
    with engine.begin() as connection:
        connection.execute(
            text(
                "INSERT INTO workflow_instances (tenant, workflow_id, name, version, state, "
                "status, input_hash, data, attempts, compensations, seq, entered_seq, "
                "state_since_ms, created_ms, updated_ms) SELECT 'acme', 'bulk-' || n, 'po', 1, "
                "'execute', 'runnable', 'h', '{}', 0, '[]', 0, 0, n, n, n "
                "FROM generate_series(1, 20000) AS n"
            )
        )
        connection.execute(text("ANALYZE workflow_instances"))
    with engine.connect() as connection:
        for before in (None, (10_000, 10_000)):
            query = instances_query(limit=50, before=before)
            sql = str(query.compile(dialect=engine.dialect, compile_kwargs={"literal_binds": True}))
            plan = "\n".join(connection.execute(text("EXPLAIN " + sql)).scalars())
            assert "Index Scan Backward using ix_workflow_instances_updated" in plan, plan
            assert "Sort" not in plan and "Seq Scan" not in plan, plan
    engine.dispose()


def test_the_overview_shows_a_stalled_outbox_in_red(pg_url: str, kafka_bootstrap: str) -> None:
    """Rows due longer than the stall time (60 s) with no relay holding their shards: the
    overview names the stall in red; rows just written are not one."""
    config = ConsoleConfig(
        db_url=pg_url,
        kafka=KafkaSettings(bootstrap=kafka_bootstrap),
        tokens=TOKENS,
        report_ttl_s=0.0,  # each view reads its own report
    )
    engine = make_engine(pg_url, poolclass=NullPool)
    with Session(engine) as session, session.begin():
        Outbox(default_topic="stalled").add(session, new_event("order.placed", "/shop", {}))
    with serving(config) as base, signed_in(base, VIEWER_TOKEN) as client:
        assert 'id="stalled"' not in client.get("/overview/live").text
        with engine.begin() as connection:  # as if written two minutes ago
            connection.execute(
                update(outbox_events).values(created_ms=outbox_events.c.created_ms - 120_000)
            )
        live = client.get("/overview/live").text
    engine.dispose()
    assert re.search(
        r'<section class="unreachable stalled" id="stalled">.*<li class="down">outbox stalled: '
        r"a row has been due for 1\d\d s on 64 shard\(s\) no live relay holds",
        live,
        re.S,
    ), live


def test_the_overview_shows_wal_message_gaps_in_red_until_acknowledged(
    console_url: str, pg_url: str
) -> None:
    write_gaps(
        pg_url, 1
    )  # as the relay records one after a failover (tests/relay/test_failover.py)
    with signed_in(console_url, VIEWER_TOKEN) as client:
        live = client.get("/overview/live").text
        assert '<section class="unreachable" id="wal-message-gaps">' in live
        assert "WAL-message gap 1 from 0/3000000 to 0/3000800" in live
        assert "60 outbox WAL message event(s) lost" in live
        acknowledged = cli_process("outbox", "gaps", "--db-url", pg_url, "--ack-all")
        assert acknowledged.code == 0
        deadline = time.monotonic() + scaled(30)  # the overview's report is cached a while
        while 'id="wal-message-gaps"' in client.get("/overview/live").text:
            assert time.monotonic() < deadline, "the acknowledged gap still shown"
            time.sleep(0.2)
