"""The application of the leak hunt (``tests/test_leak_hunt.py``), run by real processes.

A consumer app whose handler fails with an exception quoting a canary (it is dead-lettered), a
workflow engine whose one state observes a provider (its answer carries canaries) and fails the
same way, and two agent-action steps: one whose parameters and result carry canaries, one whose
provider raises an exception quoting one. The topic and the canaries come from the environment,
so the processes and the test agree.
"""

from __future__ import annotations

import os
from typing import Any

from cloudevents.core.v1.event import CloudEvent
from outboxkit.actions import step
from outboxkit.consumers import ConsumerApp
from outboxkit.outbox import Outbox, RetryPolicy
from outboxkit.outbox.backoff import Backoff
from outboxkit.workflows import (
    Budget,
    HmacVerifier,
    Wait,
    Workflow,
    WorkflowContext,
    WorkflowEngine,
)
from sqlalchemy.ext.asyncio import async_sessionmaker

TOPIC = os.environ.get("LEAK_TOPIC", "leak-events")
HANDLER_CANARY = os.environ.get("LEAK_HANDLER_CANARY", "HANDLER-CANARY")
WORKFLOW_CANARY = os.environ.get("LEAK_WORKFLOW_CANARY", "WORKFLOW-CANARY")
OBSERVATION_CANARY = os.environ.get("LEAK_OBSERVATION_CANARY", "OBSERVATION-CANARY")
OBSERVATION_SECRET = os.environ.get("LEAK_OBSERVATION_SECRET", "OBSERVATION-SECRET")
ACTION_RESULT = "ACTION-RESULT"  # the leak hunt sets these two in its own process
ACTION_RESULT_SECRET = "ACTION-RESULT-SECRET"
SIGNALS_KEY = b"leak-signals-key"

app = ConsumerApp(
    name="leak",
    retry=RetryPolicy(max_attempts=2, backoff=Backoff(base_s=0.05, cap_s=0.1), max_elapsed_s=10),
    retention_interval_s=None,
)


@app.handler("leak.order", topic=TOPIC)
async def on_order(event: CloudEvent) -> None:
    raise ValueError(f"card {HANDLER_CANARY} was declined")


leak = Workflow(
    "leak",
    version=1,
    budget=Budget(max_attempts=1, backoff=Backoff(base_s=0.05, cap_s=0.05)),
    redact_keys=("customer_name",),
)


@leak.state("intake")
async def intake(ctx: WorkflowContext) -> Wait:
    if ctx.input.get("explode"):
        raise RuntimeError(f"provider said {WORKFLOW_CANARY}")
    await ctx.observe("profile", _profile)
    return Wait(on={"leak.done": "complete"}, deadline_s=3600, sources=("leak-signals",))


async def _profile() -> dict[str, str]:
    return {"note": OBSERVATION_CANARY, "session_token": OBSERVATION_SECRET}


@step("leak.charge", target="order")
async def charge(order: str, card_number: str, note: str) -> dict[str, str]:
    """A provider call whose parameters and result carry canaries (the ledger keeps both)."""
    return {"receipt": ACTION_RESULT, "api_key": ACTION_RESULT_SECRET}


@step("leak.refund", target="order")
async def refund(order: str, note: str) -> dict[str, str]:
    """A provider call that fails with a message quoting its input."""
    raise ValueError(f"provider refused {note}")


def build_engine(sessions: async_sessionmaker[Any]) -> WorkflowEngine:
    """The engine of ``leak`` on ``sessions``, its topics named after :data:`TOPIC`."""
    return WorkflowEngine(
        [leak],
        sessions=sessions,
        outbox=Outbox(default_topic=f"{TOPIC}-wf"),
        events_topic=f"{TOPIC}-wf",
        signals_topic=f"{TOPIC}-signals",
        verifier=HmacVerifier({"leak-signals": SIGNALS_KEY}),
    )
