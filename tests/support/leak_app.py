"""The application of the leak hunt (``tests/test_leak_hunt.py``), run by real processes.

A consumer app whose handler fails with an exception quoting a canary (it is dead-lettered), and
a workflow engine whose one state fails the same way. The topic and the canaries come from the
environment, so the processes and the test agree.
"""

from __future__ import annotations

import os
from typing import Any

from cloudevents.core.v1.event import CloudEvent
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
    return Wait(on={"leak.done": "complete"}, deadline_s=3600, sources=("leak-signals",))


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
