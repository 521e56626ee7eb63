"""The agent workflow: read a support ticket, decide a refund, issue it exactly once."""

from __future__ import annotations

from dataclasses import dataclass

from outboxkit.actions import ActionOutcome, ActionStore, operation_key, run_action
from outboxkit.outbox import RetryPolicy
from outboxkit.outbox.backoff import Backoff
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from examples.refund_agent.payments import PaymentsClient

ACTION_TYPE = "payments.refund"
ACTION_VERSION = 1
MAX_REFUND_CENTS = 50_000


@dataclass(frozen=True)
class Ticket:
    """A customer's support ticket asking for money back."""

    ticket_id: str
    charge_id: str
    amount_cents: int
    currency: str = "EUR"


class RefundAgent:
    """An agent whose ``issue-refund`` step is a recorded, at-most-once action.

    The decision step is a fixed policy standing in for a model's tool call; what matters is
    that a retry of the same workflow run and step yields the same operation key.
    """

    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        store: ActionStore,
        payments: PaymentsClient,
        *,
        tenant: str,
        timeout_s: float = 10.0,
        lease_s: float | None = None,
        retry: RetryPolicy | None = None,
        poll_backoff: Backoff | None = None,
    ) -> None:
        self.sessions = sessions
        self.store = store
        self.payments = payments
        self.tenant = tenant
        self.timeout_s = timeout_s
        self.lease_s = lease_s
        self.retry = retry
        self.poll_backoff = poll_backoff

    def refund_key(self, run_id: str, ticket: Ticket) -> str:
        """The operation key of this run's refund step: no attempt number, no clock."""
        return operation_key(
            self.tenant, run_id, "issue-refund", ACTION_TYPE, ticket.charge_id, ACTION_VERSION
        )

    async def handle(self, run_id: str, ticket: Ticket) -> ActionOutcome:
        """Run the workflow for ``ticket``; safe to call again after any failure or crash."""
        params = {
            "charge_id": ticket.charge_id,
            "amount_cents": min(ticket.amount_cents, MAX_REFUND_CENTS),
            "currency": ticket.currency,
        }

        async def issue(idempotency_key: str):
            return await self.payments.refund(idempotency_key, **params)

        return await run_action(
            self.sessions,
            self.store,
            issue,
            tenant=self.tenant,
            key=self.refund_key(run_id, ticket),
            action_type=ACTION_TYPE,
            params=params,
            timeout_s=self.timeout_s,
            retry=self.retry,
            reconciler=self.payments.reconcile,
            lease_s=self.lease_s,
            poll_backoff=self.poll_backoff,
        )
