"""Producer overhead: a transaction writing one domain row, with and without one outbox event.

Four sides: the domain row only; + an outbox INSERT (the default); + a transactional WAL
message (``Outbox(wal_messages=True)``, for a logical-mode relay); + the same message sent with
the COMMIT in one round trip (``emit_at_commit=True``). All sides run the same
number of sequential transactions against the same PostgreSQL database, interleaved in rounds
so that drift in the machine's load hits all alike. Usage:

    python -m bench.producer_overhead [--transactions 5000]
"""

from __future__ import annotations

import argparse
import os
import time

from outboxkit.outbox import Outbox, new_event
from outboxkit.outbox.db import make_engine
from sqlalchemy import Column, Integer, MetaData, String, Table, text
from sqlalchemy.orm import Session

from bench.common import postgres_database, report

domain = MetaData()
accounts = Table(
    "bench_accounts",
    domain,
    Column("id", Integer, primary_key=True),
    Column("owner", String(50), nullable=False),
)


def run_side(engine, first_id: int, count: int, outbox: Outbox | None) -> float:
    """Seconds for ``count`` transactions, each inserting one row (and one event)."""
    started = time.perf_counter()
    for n in range(first_id, first_id + count):
        with Session(engine) as session, session.begin():
            session.execute(accounts.insert().values(id=n, owner=f"owner-{n}"))
            if outbox is not None:
                data = {"account": n, "owner": f"owner-{n}"}
                outbox.add(session, new_event("account.opened", "/bank", data, partitionkey=str(n)))
    return time.perf_counter() - started


def round_trip_seconds(engine, count: int = 2000) -> float:
    """Mean time of one trivial statement on an open transaction: a round trip's cost."""
    with engine.connect() as connection:
        connection.execute(text("SELECT 1"))
        started = time.perf_counter()
        for _ in range(count):
            connection.execute(text("SELECT 1"))
        elapsed = time.perf_counter() - started
        connection.rollback()
    return elapsed / count


def main() -> None:
    """Alternate rounds of both sides and print the ratio of total times."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transactions", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    per_round = args.transactions // args.rounds
    outbox = Outbox(default_topic="bench.accounts")
    messages = Outbox(default_topic="bench.accounts", wal_messages=True)
    at_commit = Outbox(default_topic="bench.accounts", wal_messages=True, emit_at_commit=True)
    with postgres_database() as url:
        engine = make_engine(url, pool_size=1)
        domain.create_all(engine)
        run_side(engine, 10_000_000, 200, outbox)  # warm-up: connection, statement caches
        run_side(engine, 10_000_200, 200, messages)
        run_side(engine, 10_000_400, 200, at_commit)
        plain = with_event = with_message = with_at_commit = 0.0
        next_id = 0
        for _ in range(args.rounds):
            plain += run_side(engine, next_id, per_round, None)
            next_id += per_round
            with_event += run_side(engine, next_id, per_round, outbox)
            next_id += per_round
            with_message += run_side(engine, next_id, per_round, messages)
            next_id += per_round
            with_at_commit += run_side(engine, next_id, per_round, at_commit)
            next_id += per_round
        round_trip = round_trip_seconds(engine)
        engine.dispose()
    count = per_round * args.rounds
    ratio = with_event / plain
    message_ratio = with_message / plain
    at_commit_ratio = with_at_commit / plain
    # The event costs one more statement, hence one more round trip: the ratio cannot go below
    # this floor on this machine, whatever the writer does in Python.
    floor = (plain / count + round_trip) / (plain / count)
    report(
        "producer_overhead",
        f"{count:,} transactions per side, PostgreSQL, sequential",
        ["side", "seconds", "ms per transaction"],
        [
            ["domain row only", plain, plain / count * 1000],
            ["domain row + outbox event (INSERT)", with_event, with_event / count * 1000],
            ["domain row + WAL message", with_message, with_message / count * 1000],
            ["domain row + WAL message at commit", with_at_commit, with_at_commit / count * 1000],
            ["one round trip (SELECT 1)", round_trip * count, round_trip * 1000],
        ],
        {
            "transactions": count,
            "plain_seconds": plain,
            "with_event_seconds": with_event,
            "ratio": ratio,
            "wal_message_seconds": with_message,
            "wal_message_ratio": message_ratio,
            "wal_message_at_commit_seconds": with_at_commit,
            "wal_message_at_commit_ratio": at_commit_ratio,
            "load_average": os.getloadavg(),
            "round_trip_ms": round_trip * 1000,
            "round_trip_floor_ratio": floor,
            "target": 1.3,
        },
    )
    load = os.getloadavg()
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print(f"ratio with-event/plain = {ratio:.2f} (INSERT; target <= 1.3)")
    print(f"ratio with-message/plain = {message_ratio:.2f} (WAL message; target <= 1.3)")
    print(f"ratio with-message-at-commit/plain = {at_commit_ratio:.2f} (one round trip; <= 1.3)")
    print(f"floor from the extra round trip alone = {floor:.2f}")


if __name__ == "__main__":
    main()
