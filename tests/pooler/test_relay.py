"""The relay through PgBouncer in transaction mode, its URL as docs/deploy.md gives it: every
committed row published once, polling (no listen_host: LISTEN is skipped with one line)."""

from __future__ import annotations

from outboxkit.outbox import new_event
from outboxkit.outbox.kafka_settings import KafkaSettings
from outboxkit.relay import Relay

from tests.relay.test_relay import FAST, table_counts, write_events
from tests.support.kafka import read_topic
from tests.support.waits import scaled

EVENTS = 200


async def test_the_relay_through_the_pooler_publishes_every_row_once(
    pgbouncer_url: str, kafka_bootstrap: str, topic: str
) -> None:
    url = f"{pgbouncer_url}?pooler=transaction"
    write_events(url, topic, [new_event("t", "/shop", {"n": n}) for n in range(EVENTS)])
    relay = Relay(db_url=url, kafka=KafkaSettings(bootstrap=kafka_bootstrap), options=FAST)
    assert await relay.drain(timeout_s=scaled(120)) == EVENTS
    records = await read_topic(kafka_bootstrap, topic, expected=EVENTS)
    assert len({record.value for record in records}) == EVENTS
    assert table_counts(url) == {"published": EVENTS, "parked": 0, "total": EVENTS}
