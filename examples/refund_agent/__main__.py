"""``python -m examples.refund_agent``: a durable pydantic-ai agent whose refund happens once.

Without arguments it runs the demo against its own provider on loopback, with the scripted
model (offline). ``refund`` runs the agent on one ticket against a provider given by URL and
prints the outcome as JSON (a worker process, which the crash test kills).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import uuid

from outboxkit.actions import ActionError, ActionOutcomeUnknownError, ActionStore
from outboxkit.agents import AgentRun
from outboxkit.migrations.runner import upgrade
from outboxkit.outbox.db import make_async_engine
from outboxkit.outbox.settings import Settings
from outboxkit.outbox.tables import outbox_events
from sqlalchemy import select
from sqlalchemy.ext.asyncio import async_sessionmaker

from examples.refund_agent.agent import (
    Ticket,
    handle_ticket,
    refund_agent,
)
from examples.refund_agent.payments import PaymentsClient
from examples.refund_agent.provider import Fault, PaymentProvider

TENANT = "acme-shop"


async def demo(db_url: str) -> int:
    """Lose the provider's reply after it refunded, run the agent again, count the refunds."""
    upgrade(db_url)
    engine = make_async_engine(db_url)
    sessions = async_sessionmaker(engine, expire_on_commit=False)
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    ticket = Ticket(ticket_id="T-1001", charge_id="ch_42", amount_cents=1999)
    try:
        with PaymentProvider() as provider:
            agent = refund_agent(PaymentsClient(provider.url, account=TENANT))
            actions = AgentRun(sessions, tenant=TENANT, run_id=run_id, timeout_s=5)
            key = agent.tool_key(actions, "refund", ticket.tool_arguments())
            print(f"agent run {run_id}, refund operation {key}")

            print("1. the model calls the refund tool; the provider refunds, then drops the reply")
            provider.inject(Fault.DROP_AFTER_COMMIT)
            try:
                await handle_ticket(actions, agent, ticket)
            except ActionOutcomeUnknownError as error:
                print(
                    f"   the run stops: outcome UNKNOWN, not retried blindly ({error.record.state})"
                )

            print("2. the run starts again with the same run id; the reconciler finds the refund")
            answer = await handle_ticket(actions, agent, ticket)
            print(f"   agent: {answer.output}")

            print("3. the run again: the model is not asked again, the refund not made again")
            again = await handle_ticket(actions, agent, ticket)
            print(f"   agent: {again.output} (model requests sent: {again.model_calls})")

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
    """The agent on one ticket against an external provider; prints one JSON line."""
    engine = make_async_engine(args.db_url)
    sessions = async_sessionmaker(engine, expire_on_commit=False)
    payments = PaymentsClient(args.provider_url, account=args.tenant)
    actions = AgentRun(
        sessions,
        tenant=args.tenant,
        run_id=args.run_id,
        timeout_s=args.timeout,
        lease_s=args.lease,
    )
    ticket = Ticket(ticket_id="T-cli", charge_id=args.charge_id, amount_cents=args.amount)
    try:
        result = await handle_ticket(actions, refund_agent(payments), ticket)
        print(json.dumps({"output": result.output}))
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
    """Parse arguments and run the demo or one ticket."""
    parser = argparse.ArgumentParser(prog="python -m examples.refund_agent")
    parser.add_argument("--db-url", default=Settings().db_url, help="[env: OUTBOXKIT_DB_URL]")
    commands = parser.add_subparsers(dest="command")
    one = commands.add_parser("refund", help="run the agent on one ticket against --provider-url")
    one.add_argument("--provider-url", required=True)
    one.add_argument("--tenant", default=TENANT)
    one.add_argument("--run-id", required=True)
    one.add_argument("--charge-id", required=True)
    one.add_argument("--amount", type=int, default=1999)
    one.add_argument("--timeout", type=float, default=10.0, help="seconds per provider call")
    one.add_argument("--lease", type=float, default=None, help="seconds (heartbeats extend it)")
    args = parser.parse_args(argv)
    if args.command == "refund":
        return asyncio.run(refund_once(args))
    return asyncio.run(demo(args.db_url))


if __name__ == "__main__":
    raise SystemExit(main())
