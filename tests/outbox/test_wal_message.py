"""The WAL-message format of ``Outbox(wal_messages=True)``, and its fallback off PostgreSQL."""

from __future__ import annotations

import pytest
from outboxkit.outbox import Outbox, new_event, wal_message
from outboxkit.outbox.db import make_engine
from outboxkit.outbox.events import encode_binary
from outboxkit.outbox.tables import outbox_events
from outboxkit.outbox.writer import outbox_row
from sqlalchemy import func, select
from sqlalchemy.orm import Session


@pytest.mark.parametrize("key", ["k-1", None])
def test_a_row_survives_the_message_format(key: str | None) -> None:
    event = new_event("t", "/src", {"ü": "x" * 3000}, partitionkey=key)
    row = outbox_row(encode_binary(event), "topic.a")
    decoded = wal_message.decode(wal_message.encode(row))
    assert decoded == {name: row[name] for name in decoded}
    assert set(row) - set(decoded) == {"shard"}  # derived from the key and id again


def test_an_unknown_format_is_refused() -> None:
    with pytest.raises(ValueError, match="version"):
        wal_message.decode(b"\x07rest")


def test_wal_messages_on_sqlite_go_to_the_table(sqlite_url: str) -> None:
    engine = make_engine(sqlite_url)
    with Session(engine) as session, session.begin():
        event = new_event("t", "/src", {"n": 1})
        assert Outbox(default_topic="a", wal_messages=True).add(session, event)
        assert not Outbox(default_topic="a", wal_messages=True).add(session, event)  # dedup
    with engine.connect() as conn:
        assert conn.scalar(select(func.count()).select_from(outbox_events)) == 1
    engine.dispose()
