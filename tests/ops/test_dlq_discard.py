"""``outboxkit dlq discard`` / ``undiscard`` on real Kafka and PostgreSQL: a dry run counts,
a reason is required, discarded letters leave the listing and are never replayed until they are
brought back, and they stay in Kafka to be shown."""

from __future__ import annotations

import uuid

import pytest
from outboxkit.ops.dlq.tables import dlq_discards
from outboxkit.outbox.db import make_engine
from sqlalchemy import select
from sqlalchemy.pool import NullPool

from tests.support.consumers import dead_letters_of_two_causes
from tests.support.ops import cli, end_offsets


def discard_rows(db_url: str) -> list:
    engine = make_engine(db_url, poolclass=NullPool)
    with engine.connect() as connection:
        rows = connection.execute(select(dlq_discards).order_by(dlq_discards.c.dlq_offset)).all()
    engine.dispose()
    return list(rows)


async def test_discarded_letters_are_not_listed_nor_replayed_until_brought_back(
    pg_url: str, kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OUTBOXKIT_DB_URL", raising=False)
    topic = f"discard-{uuid.uuid4().hex[:10]}"
    dlq = await dead_letters_of_two_causes(kafka_bootstrap, topic)
    where = ("--db-url", pg_url, "--bootstrap", kafka_bootstrap)
    timeouts = ("--error-class", "Timeout")

    async def run(*argv: str) -> dict:
        result = await cli(*argv, "--json")
        assert result.code == 0, result.err
        return result.json()

    # a dry run counts and changes nothing; without a reason nothing runs at all
    dry = await run("dlq", "discard", dlq, *timeouts, "--reason", "-", "--dry-run", *where)
    assert (dry["matched"], dry["changed"], dry["unchanged"]) == (2, 2, 0)
    assert discard_rows(pg_url) == []
    refused = await cli("dlq", "discard", dlq, *timeouts, *where)
    assert refused.code == 2 and "--reason" in refused.err
    # the discard: recorded with who and why, once
    done = await run(
        "dlq", "discard", dlq, *timeouts, "--reason", "the timeout orders were re-entered",
        "--by", "ann", *where,
    )  # fmt: skip
    assert (done["changed"], done["unchanged"]) == (2, 0)
    rows = discard_rows(pg_url)
    assert [(r.dlq_partition, r.dlq_offset) for r in rows] == [(0, 4), (0, 5)]
    assert {(r.discarded_by, r.reason, r.discard_id) for r in rows} == {
        ("ann", "the timeout orders were re-entered", done["discard_id"])
    }
    again = await run("dlq", "discard", dlq, *timeouts, "--reason", "again", *where)
    assert (again["changed"], again["unchanged"]) == (0, 2)
    assert {r.reason for r in discard_rows(pg_url)} == {"the timeout orders were re-entered"}
    # listed: without them by default, marked with --include-discarded, all without a database
    listed = await run("dlq", "list", dlq, *where)
    assert listed["matched"] == 4 and listed["discards_checked"]
    assert {r["error_class"] for r in listed["records"]} == {"permanent:Limit"}
    everything = await run("dlq", "list", dlq, "--include-discarded", *where)
    assert [r["discarded"] for r in everything["records"]] == [False] * 4 + [True] * 2
    unchecked = await run("dlq", "list", dlq, "--bootstrap", kafka_bootstrap)
    assert unchecked["matched"] == 6 and not unchecked["discards_checked"]
    # still in Kafka, shown as before
    shown = await run("dlq", "show", dlq, "5", "--bootstrap", kafka_bootstrap)
    assert shown["error_class"] == "exhausted:Timeout"
    # a replay of everything skips them, forced or not
    replay = await run("dlq", "replay", dlq, "--force", *where)
    assert (replay["replayed"], replay["skipped_discarded"]) == (4, 2)
    assert await end_offsets(kafka_bootstrap, topic) == [4]
    # brought back, they replay
    back = await run("dlq", "undiscard", dlq, "--reason", "replay them after all", *where)
    assert (back["matched"], back["changed"], back["unchanged"]) == (6, 2, 4)
    assert discard_rows(pg_url) == []
    replay = await run("dlq", "replay", dlq, *where)
    assert (replay["replayed"], replay["skipped_already_replayed"]) == (2, 4)
    assert await end_offsets(kafka_bootstrap, topic) == [6]
