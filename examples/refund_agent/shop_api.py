"""The shop's own HTTP API that agents call, with an effect outside its database.

``POST /tickets/{ticket_id}/refund`` (``Idempotency-Key`` and ``X-Tenant`` headers, body
``{"charge_id", "amount_cents", "currency"}``) refunds the ticket's charge at the payment
provider and records the refund on the ticket. Two kinds of effect, two tools:

- the ticket's refund row and its ``shop.ticket.refunded`` event are database effects: they
  are written with the request's session and commit together with the stored response
  (:mod:`outboxkit.idempotency`);
- the provider's refund is an external effect, which no database transaction can roll back:
  it runs as an agent action (:func:`outboxkit.actions.run_action`) whose key is derived from
  the request's scope and Idempotency-Key, so a retry of the request (after a 5xx, a crash or
  a lost reply) finds the action's recorded outcome instead of refunding again.

The external step comes first and the database change after it (the row keeps the provider's
refund id). A failure in between rolls the row back and releases the key; the retry runs the
handler again, ``run_action`` returns the stored result (``executed=False``) or reconciles an
unknown one with the provider, and the row is written once.
"""

from __future__ import annotations

from typing import Any

from outboxkit.actions import (
    ActionError,
    ActionOutcomeUnknownError,
    ActionStore,
    operation_key,
    run_action,
)
from outboxkit.idempotency import IdempotencyMiddleware, context_of, header_scope
from outboxkit.outbox import Outbox, new_event
from sqlalchemy import Column, Integer, MetaData, String, Table
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from examples.refund_agent.payments import PaymentsClient

ACTION_TYPE = "payments.refund"

shop_tables = MetaData()
ticket_refunds = Table(
    "shop_ticket_refunds",
    shop_tables,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("tenant", String(64), nullable=False),
    Column("ticket_id", String(64), nullable=False),
    Column("refund_id", String(64), nullable=False),
    Column("amount_cents", Integer, nullable=False),
)


def shop_app(engine: AsyncEngine, provider_url: str, *, timeout_s: float = 10.0) -> Any:
    """The shop's ASGI app: the idempotency middleware around the refund route."""
    sessions = async_sessionmaker(engine, expire_on_commit=False)
    actions = ActionStore()
    outbox = Outbox(default_topic="shop.tickets")

    async def refund_ticket(request: Request) -> JSONResponse:
        context = context_of(request.scope)
        tenant, request_key = context.scope_value, context.key
        assert tenant is not None and request_key is not None
        ticket_id = request.path_params["ticket_id"]
        body = await request.json()
        params = {
            "charge_id": body["charge_id"],
            "amount_cents": body["amount_cents"],
            "currency": body["currency"],
        }
        payments = PaymentsClient(provider_url, account=tenant)

        async def issue(idempotency_key: str) -> Any:
            return await payments.refund(idempotency_key, **params)

        # 1. the external effect, at most once per (scope, Idempotency-Key)
        try:
            outcome = await run_action(
                sessions,
                actions,
                issue,
                tenant=tenant,
                key=operation_key(tenant, request_key, "refund-ticket", ACTION_TYPE, ticket_id, 1),
                action_type=ACTION_TYPE,
                params=params,
                timeout_s=timeout_s,
                reconciler=payments.reconcile,
            )
        except ActionOutcomeUnknownError:
            # not stored (5xx): the key is released and the agent's retry reconciles
            return JSONResponse({"error": "refund outcome unknown, retry"}, status_code=503)
        except ActionError as error:
            return JSONResponse({"error": type(error).__name__}, status_code=502)

        # 2. the database effect and its event, committed with the stored response
        session = await context.session()
        await session.execute(
            ticket_refunds.insert().values(
                tenant=tenant,
                ticket_id=ticket_id,
                refund_id=outcome.external_ref,
                amount_cents=params["amount_cents"],
            )
        )
        await outbox.add_async(
            session,
            new_event(
                "shop.ticket.refunded",
                "/shop/tickets",
                {"tenant": tenant, "ticket_id": ticket_id, "refund_id": outcome.external_ref},
                partitionkey=ticket_id,
            ),
        )
        reply = {"ticket_id": ticket_id, "refund_id": outcome.external_ref}
        return JSONResponse(reply, status_code=201)

    api = Starlette(routes=[Route("/tickets/{ticket_id}/refund", refund_ticket, methods=["POST"])])
    return IdempotencyMiddleware(
        api,
        engine=engine,
        routes=["POST /tickets/{ticket_id}/refund"],
        scope_of=header_scope("X-Tenant"),  # set by the shop's gateway after authentication
    )
