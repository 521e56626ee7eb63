"""``python -m examples.refund_agent``: the lost-reply retry that ends in one refund.

Without arguments it runs the demo against its own provider on loopback. ``refund`` runs one
agent step against a provider given by URL and prints the outcome as JSON (a worker process).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import uuid

from outboxkit.actions import ActionError, ActionOutcomeUnknownError, ActionStore
from outboxkit.migrations.runner import upgrade
from outboxkit.outbox.db import make_async_engine
from outboxkit.outbox.settings import Settings
from outboxkit.outbox.tables import outbox_events
from sqlalchemy import select
from sqlalchemy.ext.asyncio import async_sessionmaker

from examples.refund_agent.agent import RefundAgent, Ticket
from examples.refund_agent.payments import PaymentsClient
from examples.refund_agent.provider import Fault, PaymentProvider

TENANT = "acme-shop"


async def demo(db_url: str) -> int:
    """Lose the provider's reply after it refunded, retry the step, and count the refunds."""
    upgrade(db_url)
    engine = make_async_engine(db_url)
    sessions = async_sessionmaker(engine, expire_on_commit=False)
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    ticket = Ticket(ticket_id="T-1001", charge_id="ch_42", amount_cents=1999)
    try:
        with PaymentProvider() as provider:
            payments = PaymentsClient(provider.url, account=TENANT)
            agent = RefundAgent(sessions, ActionStore(), payments, tenant=TENANT, timeout_s=5)
            key = agent.refund_key(run_id, ticket)
            print(f"workflow run {run_id}, refund step key {key}")

            print("1. the provider commits the refund, then drops the connection unanswered")
            provider.inject(Fault.DROP_AFTER_COMMIT)
            try:
                await agent.handle(run_id, ticket)
            except ActionOutcomeUnknownError as error:
                print(f"   outcome UNKNOWN, not retried blindly: {error.record.last_error}")

            print("2. the agent retries the step: same key; the reconciler finds the refund")
            outcome = await agent.handle(run_id, ticket)
            print(
                f"   {outcome.operation.state}: refund {outcome.external_ref}, "
                f"executed by this call: {outcome.executed}"
            )

            print("3. once more: the stored result, no call to the provider")
            again = await agent.handle(run_id, ticket)
            print(
                f"   {again.operation.state}: refund {again.external_ref}, "
                f"executed by this call: {again.executed}"
            )

            refunds = provider.refund_count(TENANT)
            print(f"provider refunds: {refunds}")
            async with sessions() as session:
                trail = await ActionStore().history(session, TENANT, key)
                event_rows = await session.execute(
                    select(outbox_events.c.type, outbox_events.c.event_id)
                    .where(outbox_events.c.event_id.startswith(f"{TENANT}/{key}/", autoescape=True))
                    .order_by(outbox_events.c.id)
                )
                written = list(event_rows)
            print("audit trail:")
            for entry in trail:
                print(
                    f"   {entry.from_state or '-'} -> {entry.to_state} by {entry.actor}: "
                    f"{entry.reason}"
                )
            print("events in the outbox:")
            for event_type, event_id in written:
                print(f"   {event_type}  {event_id}")
            return 0 if refunds == 1 else 1
    finally:
        await engine.dispose()


async def refund_once(args: argparse.Namespace) -> int:
    """One agent step against an external provider; prints the outcome as one JSON line."""
    engine = make_async_engine(args.db_url)
    sessions = async_sessionmaker(engine, expire_on_commit=False)
    payments = PaymentsClient(args.provider_url, account=args.tenant)
    agent = RefundAgent(
        sessions,
        ActionStore(),
        payments,
        tenant=args.tenant,
        timeout_s=args.timeout,
        lease_s=args.lease,
    )
    ticket = Ticket(ticket_id="T-cli", charge_id=args.charge_id, amount_cents=args.amount)
    try:
        outcome = await agent.handle(args.run_id, ticket)
        print(json.dumps({"state": outcome.operation.state, "result": outcome.result}))
        return 0
    except ActionOutcomeUnknownError as error:
        print(json.dumps({"state": "UNKNOWN", "error": str(error)}))
        return 3
    except ActionError as error:
        print(json.dumps({"error": str(error)}))
        return 4
    finally:
        await engine.dispose()


def main(argv: list[str] | None = None) -> int:
    """Parse arguments and run the demo or one refund step."""
    parser = argparse.ArgumentParser(prog="python -m examples.refund_agent")
    parser.add_argument("--db-url", default=Settings().db_url, help="[env: OUTBOXKIT_DB_URL]")
    commands = parser.add_subparsers(dest="command")
    one = commands.add_parser("refund", help="run one refund step against --provider-url")
    one.add_argument("--provider-url", required=True)
    one.add_argument("--tenant", default=TENANT)
    one.add_argument("--run-id", required=True)
    one.add_argument("--charge-id", required=True)
    one.add_argument("--amount", type=int, default=1999)
    one.add_argument("--timeout", type=float, default=10.0, help="seconds per provider call")
    one.add_argument("--lease", type=float, default=None, help="seconds (default: timeout + 5)")
    args = parser.parse_args(argv)
    if args.command == "refund":
        return asyncio.run(refund_once(args))
    return asyncio.run(demo(args.db_url))


if __name__ == "__main__":
    raise SystemExit(main())
