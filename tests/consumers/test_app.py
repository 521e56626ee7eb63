"""ConsumerApp: handler registration and the signature check."""

from __future__ import annotations

import pytest
from cloudevents.core.v1.event import CloudEvent
from outboxkit.consumers import ConsumerApp, HandlerSignatureError
from pydantic import BaseModel
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session


class Order(BaseModel):
    order_id: int


def test_handler_signatures_are_checked_at_registration() -> None:
    app = ConsumerApp(name="c")

    @app.handler("order.placed", topic="orders")
    async def ok(order: Order, event: CloudEvent, session: AsyncSession) -> None: ...

    @app.handler("order.synced", topic="orders")
    def sync_ok(order: Order, session: Session) -> None: ...

    assert app.topics == ["orders"]
    with pytest.raises(HandlerSignatureError):

        @app.handler("a", topic="orders")
        async def unknown(order: dict) -> None: ...

    with pytest.raises(HandlerSignatureError):

        @app.handler("b", topic="orders")
        def sync_with_async_session(session: AsyncSession) -> None: ...

    with pytest.raises(ValueError, match="already registered"):

        @app.handler("order.placed", topic="orders")
        async def again(order: Order) -> None: ...
