"""The console's pages on big tables: p50/p95 render time of each page (issue 25, item 9).

A throwaway PostgreSQL database is filled with ``--outbox`` outbox rows (80 % published, 10 %
pending, 5 % parked, 5 % scheduled, over 20 topics), ``--workflows`` workflow instances (10 % in
human_review), ``--actions`` agent operations (10 % UNKNOWN), ``--audit`` audit rows and
inbox rows (one per pending row), with INSERT ... SELECT over generate_series (set-up, not
measured), then ANALYZEd. ``--dead-letters`` records go to a dead-letter topic. The console is
served by uvicorn in this process; each page is fetched ``--repeat`` times over HTTP by a
signed-in client, and the wall time of each response is recorded. Every fifth dead letter (one
cause) is discarded, as ``dlq discard`` records it, so the lists leave them out.

The overview is timed twice: as viewers see it (one report shared for ``report_ttl_s``, the
console's default) and read anew on every fetch (``report_ttl_s=0``: what one refresh costs
with the kept clients). The load average is printed before and after the timings: the machine
is shared, so the figures are an upper bound.

    python -m bench.console [--outbox 1000000] [--workflows 100000] [--actions 100000]
        [--dead-letters 100000] [--repeat 20]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
import uuid

from outboxkit.console import ConsoleConfig
from outboxkit.consumers import dlq_headers
from outboxkit.outbox import new_event
from outboxkit.outbox.db import make_engine
from outboxkit.outbox.kafka_settings import KafkaSettings
from outboxkit.testing.kafka import create_topic
from sqlalchemy import text

from bench.common import kafka, postgres_database, produce_batches, report
from tests.support.console import OPERATOR_TOKEN, TOKENS, serving, signed_in
from tests.support.consumers import binary_record

TARGET_P95_MS = 300.0


def fill(url: str, outbox: int, workflows: int, actions: int, audit: int) -> int:
    """Fill the tables; the epoch ms their times are counted from."""
    now = int(time.time() * 1000)
    statements = [
        # published 80 %, pending 10 %, parked 5 %, scheduled 5 %, by the row's number
        f"""INSERT INTO outbox_events (source, event_id, type, topic, shard, headers, payload,
            created_ms, available_ms, attempts, last_error, published_ms, parked_ms,
            deliver_at_ms)
        SELECT '/bench', 'e-' || g, 'bench.t' || (g % 7), 'topic-' || (g % 20), g % 64, '{{}}',
            '\\x7b7d'::bytea, {now} - ({outbox} - g) * 10, {now}, CASE WHEN g % 20 = 18 THEN 5
            ELSE 0 END, CASE WHEN g % 20 = 18 THEN 'broker refused: message too large' END,
            CASE WHEN g % 10 < 8 THEN {now} END,
            CASE WHEN g % 20 = 18 THEN {now} - g END,
            CASE WHEN g % 20 = 19 THEN {now} + g * 1000 END
        FROM generate_series(1, {outbox}) AS g""",
        f"""INSERT INTO workflow_instances (tenant, workflow_id, name, version, state, status,
            input_hash, data, run_at_ms, attempts, compensations, seq, entered_seq,
            state_since_ms, created_ms, updated_ms)
        SELECT 't' || (g % 10), 'wf-' || g, 'po', 1,
            CASE WHEN g % 10 = 0 THEN 'human_review' ELSE 'await_approval' END,
            CASE WHEN g % 10 = 0 THEN 'waiting' ELSE 'runnable' END, md5(g::text), '{{}}',
            {now} + g, 0, '[]', 1, 1, {now} - g, {now} - g * 2, {now} - g
        FROM generate_series(1, {workflows}) AS g""",
        f"""INSERT INTO agent_operations (tenant, op_key, generation, action_type, params_hash,
            state, attempts, needs_attention, created_ms, updated_ms, expires_ms)
        SELECT 't' || (g % 10), 'op-' || g, 1, 'payments.charge', md5(g::text),
            CASE WHEN g % 10 = 0 THEN 'UNKNOWN' ELSE 'SUCCEEDED' END, 1, false, {now} - g * 3,
            {now} - g * 3, {now} + 86400000
        FROM generate_series(1, {actions}) AS g""",
        f"""INSERT INTO console_audit (at_ms, actor, role, action, target, filter, count, reason,
            outcome)
        SELECT {now} - g, 'otto', 'operator', 'outbox.requeue', 'outbox_events', '{{}}', 1,
            'bench', 'requeued 1 row(s)'
        FROM generate_series(1, {audit}) AS g""",
        f"""INSERT INTO inbox_events (consumer, source, event_id, processed_ms)
        SELECT 'billing', '/bench', 'e-' || g, {now} - g
        FROM generate_series(1, {outbox // 10}) AS g""",
        "ANALYZE",
    ]
    engine = make_engine(url)
    for statement in statements:
        began = time.monotonic()
        with engine.begin() as connection:
            connection.execute(text(statement))
        what = [*statement.split(), "", "", ""][2] or statement
        print(f"  {what:<20} {time.monotonic() - began:6.1f} s")
    engine.dispose()
    return now


def discard_a_fifth(url: str, dlq: str, count: int) -> None:
    """Discard the letters of one cause (every fifth), as ``dlq discard`` records them."""
    engine = make_engine(url)
    with engine.begin() as connection:
        connection.execute(
            text(
                "INSERT INTO dlq_discards (dlq_topic, dlq_partition, dlq_offset, discarded_ms, "
                "discarded_by, reason, discard_id) SELECT :topic, 0, g, 0, 'otto', 'bench', "
                "'bench' FROM generate_series(0, :last, 5) AS g"
            ),
            {"topic": dlq, "last": count - 1},
        )
    engine.dispose()


async def dead_letters(bootstrap: str, topic: str, count: int) -> None:
    await create_topic(bootstrap, topic)
    await create_topic(bootstrap, f"{topic}.dlq")

    def records():
        for n in range(count):
            key, value, headers = binary_record(
                new_event("order.placed", "/shop", {"n": n}, id=f"o-{n}")
            )
            letter = dlq_headers.DeadLetter(
                topic=topic, partition=0, offset=n, timestamp=None, key=key, value=value,
                headers=headers, error_class=f"permanent:E{n % 5}",
                error_message=f"order {n} refused", attempts=3, first_failure_ms=None,
                last_failure_ms=None,
            )  # fmt: skip
            yield key, value, letter.to_headers("shipping")

    await produce_batches(bootstrap, f"{topic}.dlq", 1, records())


def _load(when: str) -> list[float]:
    load = [round(value, 2) for value in os.getloadavg()]
    print(f"  load average {when}: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    return load


def _time_page(client, name: str, path: str, repeat: int, data: dict) -> list[object]:
    """Fetch ``path`` ``repeat`` times after one warm-up; its row of the table."""
    times = []
    for _ in range(repeat + 1):
        began = time.perf_counter()
        response = client.get(path)
        times.append((time.perf_counter() - began) * 1000)
        assert response.status_code == 200, (path, response.status_code)
    times = times[1:]  # the first fetch warms caches and connections
    p50 = statistics.median(times)
    p95 = statistics.quantiles(times, n=20)[18] if len(times) >= 2 else times[0]
    ok = "yes" if p95 <= TARGET_P95_MS else "NO"
    data["pages"][name] = {"path": path, "p50_ms": p50, "p95_ms": p95}
    print(f"  {name:<40} p50 {p50:8.1f} ms  p95 {p95:8.1f} ms")
    return [name, p50, p95, ok]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--outbox", type=int, default=1_000_000)
    parser.add_argument("--workflows", type=int, default=100_000)
    parser.add_argument("--actions", type=int, default=100_000)
    parser.add_argument("--audit", type=int, default=100_000)
    parser.add_argument("--dead-letters", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    topic = f"bench-console-{uuid.uuid4().hex[:8]}"
    with kafka() as bootstrap, postgres_database() as url:
        print("filling the database")
        now = fill(url, args.outbox, args.workflows, args.actions, args.audit)
        print(f"producing {args.dead_letters} dead letters")
        asyncio.run(dead_letters(bootstrap, topic, args.dead_letters))
        dlq = f"{topic}.dlq"
        discard_a_fifth(url, dlq, args.dead_letters)
        config = ConsoleConfig(
            db_url=url, kafka=KafkaSettings(bootstrap=bootstrap), tokens=TOKENS, dlq_topics=(dlq,)
        )
        middle = args.outbox // 2
        wf_middle = args.workflows // 2  # its id is its number: updated_ms is now - number
        pages = {
            "overview": "/",
            "overview (live part)": "/overview/live",
            "outbox pending": "/outbox?which=pending",
            "outbox pending, page at the middle": f"/outbox?which=pending&after={middle}.{middle}",
            "outbox parked": "/outbox?which=parked",
            "outbox parked, one topic": "/outbox?which=parked&topic=topic-18",
            "outbox scheduled": "/outbox?which=scheduled",
            "dead-letter topics": "/dlq",
            f"dead letters grouped ({args.dead_letters}, a fifth discarded)": f"/dlq/{dlq}",
            "dead letters of one cause (a filter)": f"/dlq/{dlq}?error_class=E1",
            "dead letters, the discarded included": f"/dlq/{dlq}?include_discarded=1",
            "dead letter": f"/dlq/{dlq}/0/{args.dead_letters // 2 + 1}",
            "dead letter, discarded": f"/dlq/{dlq}/0/{args.dead_letters // 2 // 5 * 5}",
            "actions UNKNOWN": "/actions",
            "workflows": "/workflows",
            "workflows, a page at the middle": f"/workflows?before={now - wf_middle}.{wf_middle}",
            "workflows in human_review": "/workflows?state=human_review",
            "workflow instance": f"/workflows/t0/wf-{args.workflows // 2 // 10 * 10}",
            "inbox look-up": f"/inbox?source=/bench&id=e-{args.outbox // 20}",
            "audit": "/audit",
            "audit, an old page": f"/audit?before={args.audit // 10}",
        }
        rows: list[list[object]] = []
        data: dict = {"sizes": vars(args), "pages": {}, "load_average": {}}
        data["load_average"]["before"] = _load("before the timings")
        with serving(config) as base, signed_in(base, OPERATOR_TOKEN) as client:
            for name, path in pages.items():
                rows.append(_time_page(client, name, path, args.repeat, data))
        anew = {
            "overview, read anew each fetch": "/",
            "overview (live part), read anew": "/overview/live",
        }
        config.report_ttl_s = 0.0
        with serving(config) as base, signed_in(base, OPERATOR_TOKEN) as client:
            for name, path in anew.items():
                rows.append(_time_page(client, name, path, args.repeat, data))
        data["load_average"]["after"] = _load("after the timings")
        report(
            "console",
            f"console pages: {args.outbox:,} outbox rows, {args.workflows:,} workflows, "
            f"{args.actions:,} actions, {args.dead_letters:,} dead letters",
            ["page", "p50 ms", "p95 ms", f"p95 <= {TARGET_P95_MS:g} ms"],
            rows,
            data,
        )


if __name__ == "__main__":
    main()
