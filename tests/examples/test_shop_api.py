"""An idempotent route with an effect outside the database: the shop refunds at the payment
provider from inside its handler, once per Idempotency-Key, whatever fails in between."""

from __future__ import annotations

import httpx
from outboxkit.outbox.db import make_async_engine, make_engine
from outboxkit.outbox.tables import outbox_events
from sqlalchemy import func, select

from examples.refund_agent.provider import Fault, PaymentProvider
from examples.refund_agent.shop_api import shop_app, shop_tables, ticket_refunds
from tests.support.http import serving
from tests.support.waits import scaled

BODY = {"charge_id": "ch_7", "amount_cents": 1200, "currency": "EUR"}


def rows(db_url: str, table) -> int:
    engine = make_engine(db_url)
    with engine.connect() as conn:
        found = int(conn.scalar(select(func.count()).select_from(table)) or 0)
    engine.dispose()
    return found


async def test_a_lost_provider_reply_then_a_retry_refunds_once(db_url: str) -> None:
    engine = make_engine(db_url)
    shop_tables.create_all(engine)
    engine.dispose()
    shop_engine = make_async_engine(db_url)
    headers = {"Idempotency-Key": "agent-step-1", "X-Tenant": "acme"}
    try:
        with PaymentProvider() as provider:
            async with (
                serving(shop_app(shop_engine, provider.url, timeout_s=5)) as url,
                httpx.AsyncClient(base_url=url, timeout=scaled(60)) as client,
            ):
                # the provider refunds, then its reply is lost: the shop cannot know, says 503
                provider.inject(Fault.DROP_AFTER_COMMIT)
                lost = await client.post("/tickets/T-7/refund", json=BODY, headers=headers)
                assert lost.status_code == 503
                assert provider.refund_count() == 1 and rows(db_url, ticket_refunds) == 0
                # the agent retries the same request: reconciled, recorded, not refunded again
                retried = await client.post("/tickets/T-7/refund", json=BODY, headers=headers)
                assert retried.status_code == 201
                assert retried.json()["refund_id"] == provider.refunds()[0]["id"]
                replay = await client.post("/tickets/T-7/refund", json=BODY, headers=headers)
                assert replay.content == retried.content
                assert replay.headers["idempotent-replay"] == "true"
            assert provider.refund_count() == 1
    finally:
        await shop_engine.dispose()
    assert rows(db_url, ticket_refunds) == 1
    engine = make_engine(db_url)
    with engine.connect() as conn:
        shop_events = conn.scalar(
            select(func.count())
            .select_from(outbox_events)
            .where(outbox_events.c.type == "shop.ticket.refunded")
        )
    engine.dispose()
    assert shop_events == 1
