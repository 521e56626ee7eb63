"""Action events go from the outbox to Kafka through the relay, once each, keyed by operation."""

from __future__ import annotations

import json

import pytest
from outboxkit.actions import (
    ActionOutcomeUnknownError,
    ActionReconciled,
    ActionStore,
    ActionUnknown,
    State,
)
from outboxkit.consumers import ConsumerApp
from outboxkit.outbox import Outbox
from outboxkit.outbox.kafka_settings import KafkaSettings
from outboxkit.relay import Relay, RelayOptions
from sqlalchemy.ext.asyncio import AsyncSession

from examples.refund_agent.agent import Ticket
from examples.refund_agent.provider import Fault, PaymentProvider
from tests.support.actions import RefundSteps, sessions_for
from tests.support.consumers import alive, running
from tests.support.kafka import read_topic, wait_for
from tests.support.waits import scaled

FAST = RelayOptions(lease_ttl_s=5.0, request_timeout_s=2.0, poll_interval_s=0.2)


async def test_lost_reply_story_arrives_in_kafka_in_order_without_duplicates(
    pg_url: str, kafka_bootstrap: str, topic: str
) -> None:
    store = ActionStore(Outbox(default_topic=topic))
    ticket = Ticket(ticket_id="T-1", charge_id="ch_1", amount_cents=1999)
    with PaymentProvider() as provider:
        async with sessions_for(pg_url) as sessions:
            refund = RefundSteps(sessions, store, provider.url)
            key = refund.key(ticket)
            provider.inject(Fault.DROP_AFTER_COMMIT)
            with pytest.raises(ActionOutcomeUnknownError):
                await refund(ticket)
            assert not (await refund(ticket)).executed
            assert (
                await Relay(
                    db_url=pg_url, kafka=KafkaSettings(bootstrap=kafka_bootstrap), options=FAST
                ).drain(timeout_s=scaled(60))
                == 4
            )

            for _ in range(2):  # retries after the fact write no second event
                assert not (await refund(ticket)).executed
            assert (
                await Relay(
                    db_url=pg_url, kafka=KafkaSettings(bootstrap=kafka_bootstrap), options=FAST
                ).drain(timeout_s=scaled(60))
                == 0
            )
        assert provider.refund_count() == 1

    records = await read_topic(kafka_bootstrap, topic, expected=4)
    headers = [{k: v.decode() for k, v in record.headers} for record in records]
    assert [h["ce_type"] for h in headers] == [
        "outboxkit.action.requested",
        "outboxkit.action.started",
        "outboxkit.action.unknown",
        "outboxkit.action.reconciled",
    ]
    assert {record.key for record in records} == {key.encode()}
    assert len({h["ce_id"] for h in headers}) == 4
    assert all(h["ce_id"].startswith(f"acme/{key}/g1/a") for h in headers)
    last = json.loads(records[-1].value)
    assert (last["from"], last["to"], last["external_ref"]) == ("UNKNOWN", "SUCCEEDED", "re_000001")

    # a consumer declares the event data model it handles
    app = ConsumerApp(name="action-watch", retention_interval_s=None)
    seen: list[ActionUnknown | ActionReconciled] = []

    @app.handler("outboxkit.action.unknown", topic=topic)
    async def on_unknown(event: ActionUnknown, session: AsyncSession) -> None:
        seen.append(event)

    @app.handler("outboxkit.action.reconciled", topic=topic)
    async def on_reconciled(event: ActionReconciled, session: AsyncSession) -> None:
        seen.append(event)

    async with running(app, pg_url, kafka_bootstrap) as (_, task):
        await wait_for(lambda: alive(task) or len(seen), lambda n: n == 2, 60, "two events")
    unknown, reconciled = seen
    assert isinstance(unknown, ActionUnknown) and unknown.external_ref is None
    assert isinstance(reconciled, ActionReconciled) and reconciled.key == key
    assert (reconciled.from_state, reconciled.to) == (State.UNKNOWN, State.SUCCEEDED)
    assert reconciled.external_ref == "re_000001"
