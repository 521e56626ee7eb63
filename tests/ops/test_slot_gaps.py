"""``outboxkit outbox gaps``: WAL-message gaps are listed until acknowledged, by id or all.

The gaps themselves are found by a real failover in tests/relay/test_failover.py; here they
are rows written as the relay writes them, on SQLite and PostgreSQL."""

from __future__ import annotations

from outboxkit.outbox.db import make_engine
from outboxkit.outbox.tables import outbox_slot_gaps

from tests.support.ops import cli


def write_gaps(url: str, count: int) -> None:
    engine = make_engine(url)
    with engine.begin() as conn:
        for number in range(count):
            conn.execute(
                outbox_slot_gaps.insert().values(
                    slot_name="outboxkit_db",
                    cause="failover (timeline 1 -> 2): the slot did not come along",
                    from_lsn=0x3000000 + number * 0x1000,
                    to_lsn=0x3000800 + number * 0x1000,
                    lost_events=None if number else 60,
                    count_note="counted in the WAL with pg_walinspect (committed transactions)",
                    detected_ms=1_765_000_000_000,
                )
            )
    engine.dispose()


async def test_gaps_are_listed_until_acknowledged(db_url: str) -> None:
    db = ("--db-url", db_url)
    assert (await cli("outbox", "gaps", *db)).out.strip() == "no open WAL-message gap"
    write_gaps(db_url, 3)
    listed = await cli("outbox", "gaps", *db)
    assert listed.code == 0
    assert "gap 1 from 0/3000000 to 0/3000800 (failover (timeline 1 -> 2)" in listed.out
    assert "60 outbox WAL message event(s) lost" in listed.out
    assert "an unknown number of outbox WAL message event(s) lost" in listed.out
    acknowledged = await cli("outbox", "gaps", *db, "--ack", "1", "--json")
    assert acknowledged.json() == {"acknowledged": [1]}
    open_ids = [gap["id"] for gap in (await cli("outbox", "gaps", *db, "--json")).json()["gaps"]]
    assert open_ids == [2, 3]
    every = (await cli("outbox", "gaps", *db, "--all", "--json")).json()["gaps"]
    assert [gap["acknowledged_by"] is not None for gap in every] == [True, False, False]
    again = await cli("outbox", "gaps", *db, "--ack", "1", "--ack", "2")
    assert again.code == 2
    assert again.err.strip().endswith("no open gap with id 1")
    assert (await cli("outbox", "gaps", *db, "--ack-all")).out.strip() == "acknowledged 1 gap(s): 3"
    assert (await cli("outbox", "gaps", *db)).out.strip() == "no open WAL-message gap"


async def test_ack_and_ack_all_together_are_refused_in_one_line(sqlite_url: str) -> None:
    refused = await cli("outbox", "gaps", "--db-url", sqlite_url, "--ack", "1", "--ack-all")
    assert refused.code == 2
    assert refused.err.strip().splitlines() == [
        "outboxkit: error: give --ack IDS or --ack-all, not both"
    ]
