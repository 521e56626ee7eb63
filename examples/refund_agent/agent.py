"""The refund agent: a pydantic-ai agent run durably on outboxkit's agent ledger.

``refund_agent(payments)`` is a plain pydantic-ai agent with a plain refund tool, made durable by
:class:`~outboxkit.agents.pydantic_ai.DurableAgent`: each model answer is recorded and replayed
on a resumed run, and each refund goes through the ledger at most once, keyed by charge and
reconciled with the provider by its Idempotency-Key. The model is pydantic-ai's
``FunctionModel``, scripted here to read a ticket and call the tool, so the example runs offline
(no network, no API key); a real model plugs in the same way
(``handle_ticket(..., model="openai:gpt-5")``).

``refund_step`` is the same refund as an ``@step`` of :mod:`outboxkit.actions` (the lower-level
API, without model replay), used by the ledger's own tests.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated

from outboxkit.actions import Step, current_step, step
from outboxkit.agents import AgentRun, current_call
from outboxkit.agents.pydantic_ai import DurableAgent, DurableTool, RunFinished, RunWaiting
from pydantic import BaseModel, Field
from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models import Model
from pydantic_ai.models.function import AgentInfo, FunctionModel

from examples.refund_agent.payments import PaymentsClient

ACTION_TYPE = "payments.refund"
MAX_REFUND_CENTS = 50_000
INSTRUCTIONS = (
    "You handle refund requests of a shop's customers. Refund what the ticket asks for, at most "
    f"{MAX_REFUND_CENTS} cents, with the refund tool; then tell the customer the refund's id."
)


@dataclass(frozen=True)
class Ticket:
    """A customer's support ticket asking for money back."""

    ticket_id: str
    charge_id: str
    amount_cents: int
    currency: str = "EUR"

    def prompt(self) -> str:
        """The ticket as the customer wrote it."""
        return (
            f"Ticket {self.ticket_id}: please refund {self.amount_cents} {self.currency} "
            f"cents of charge {self.charge_id}."
        )

    def tool_arguments(self) -> dict[str, object]:
        """The refund tool's arguments for this ticket, as the scripted model sends them."""
        return {
            "charge_id": self.charge_id,
            "amount_cents": self.amount_cents,
            "currency": self.currency,
        }


class Refund(BaseModel):
    """The refund tool's result: the provider's refund record."""

    id: str
    charge_id: str
    amount_cents: int
    currency: str
    status: str


RefundStep = Step[..., Refund]


def refund_step(payments: PaymentsClient) -> RefundStep:
    """The refund step on ``payments``: one refund per charge in a run, whatever happens."""

    @step(
        ACTION_TYPE,
        target="charge_id",
        reconciler=payments.reconcile,
        external_ref=lambda refund: refund.id,
    )
    async def refund(
        charge_id: str,
        amount_cents: Annotated[int, Field(gt=0, le=MAX_REFUND_CENTS)],
        currency: str = "EUR",
    ) -> Refund:
        """Refund ``amount_cents`` of the customer's charge ``charge_id``."""
        reply = await payments.refund(
            current_step().idempotency_key,
            charge_id=charge_id,
            amount_cents=amount_cents,
            currency=currency,
        )
        return Refund.model_validate(reply)

    return refund


def build_agent(refund: RefundStep) -> Agent[None, str]:
    """The agent, with the refund step as its tool (no model yet: given per run)."""
    return Agent(name="refund-agent", instructions=INSTRUCTIONS, tools=[refund])


def scripted_model(ticket: Ticket, *, calls: int = 1) -> FunctionModel:
    """A model that calls the refund tool for ``ticket`` ``calls`` times, then answers.

    Calling it twice is what a real model does now and then: the second call must get the
    stored refund, not make another one.
    """

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        returns = tool_returns(messages)
        if len(returns) < calls:
            arguments = ticket.tool_arguments()
            return ModelResponse(
                parts=[ToolCallPart("refund", arguments, tool_call_id=f"call-{len(returns)}")]
            )
        refunds = {json.loads(part.model_response_str())["id"] for part in returns}
        return ModelResponse(parts=[TextPart(f"Refunded as {', '.join(sorted(refunds))}.")])

    return FunctionModel(respond, model_name="scripted-refund-model")


def tool_returns(messages: list[ModelMessage]) -> list[ToolReturnPart]:
    """The tool results the model has seen so far, in order."""
    return [
        part
        for message in messages
        if isinstance(message, ModelRequest)
        for part in message.parts
        if isinstance(part, ToolReturnPart)
    ]


def refund_agent(payments: PaymentsClient) -> DurableAgent[None, str]:
    """The durable agent: its refund tool at most once per charge in a run, whatever happens."""

    async def refund(
        charge_id: str,
        amount_cents: Annotated[int, Field(gt=0, le=MAX_REFUND_CENTS)],
        currency: str = "EUR",
    ) -> Refund:
        """Refund ``amount_cents`` of the customer's charge ``charge_id``."""
        reply = await payments.refund(
            current_call().idempotency_key,
            charge_id=charge_id,
            amount_cents=amount_cents,
            currency=currency,
        )
        return Refund.model_validate(reply)

    agent = Agent(name="refund-agent", instructions=INSTRUCTIONS, tools=[refund])
    refunds = DurableTool(
        target=("charge_id",), reconciler=payments.reconcile, action_type=ACTION_TYPE
    )
    return DurableAgent(agent, version=1, tools={"refund": refunds})


async def handle_ticket(
    run: AgentRun,
    agent: DurableAgent[None, str],
    ticket: Ticket,
    *,
    model: Model | str | None = None,
) -> RunFinished[str]:
    """Run the agent on ``ticket`` as the durable run ``run``; ``.output`` answers.

    Safe to call again with the same run id after any failure or crash: answered model
    requests are replayed and the refund tool returns the stored refund instead of refunding
    again.
    """
    result = await agent.run(run, ticket.prompt(), model=model or scripted_model(ticket))
    assert not isinstance(result, RunWaiting)  # no tool of this agent needs an approval
    return result
