"""Consumer apps run as separate processes by the consumer tests (``outboxkit consume``).

The input topic comes from ``OUTBOXKIT_TEST_TOPIC`` so each test uses its own topic; the
handler records each application of an event as a row of ``consumer_effects`` (no unique key,
so applying an event twice shows as two rows).
"""

from __future__ import annotations

import asyncio
import os
import threading

from cloudevents.core.v1.event import CloudEvent
from outboxkit.consumers import ConsumerApp
from outboxkit.outbox import RetryPolicy
from outboxkit.outbox.backoff import Backoff
from pydantic import BaseModel
from sqlalchemy import BigInteger, Column, Integer, MetaData, String, Table, insert
from sqlalchemy.ext.asyncio import AsyncSession

effects_metadata = MetaData()
consumer_effects = Table(
    "consumer_effects",
    effects_metadata,
    Column("id", BigInteger().with_variant(Integer(), "sqlite"), primary_key=True),
    Column("consumer", String(200), nullable=False),
    Column("source", String(512), nullable=False),
    Column("event_id", String(256), nullable=False),
    Column("n", Integer, nullable=False),
    Column("pid", Integer, nullable=False),
)

WIDGET_TYPE = "widget.created"


class Widget(BaseModel):
    """The data of a ``widget.created`` event."""

    n: int


TOPIC = os.environ.get("OUTBOXKIT_TEST_TOPIC", "consumer-test-input")
HANDLER_DELAY_S = int(os.environ.get("OUTBOXKIT_TEST_HANDLER_DELAY_MS", "0")) / 1000

effects_app = ConsumerApp(
    name="effects",
    retry=RetryPolicy(max_attempts=5, backoff=Backoff(base_s=0.05, cap_s=0.5), max_elapsed_s=20),
    # A SIGKILLed member leaves the group after the session timeout: keep it short in tests.
    consumer_options={"session_timeout_ms": 6000, "heartbeat_interval_ms": 1000},
    retention_interval_s=None,
)


@effects_app.handler(WIDGET_TYPE, topic=TOPIC)
async def record_widget(widget: Widget, event: CloudEvent, session: AsyncSession) -> None:
    """Write one effect row per application of the event."""
    if HANDLER_DELAY_S:
        await asyncio.sleep(HANDLER_DELAY_S)
    await session.execute(
        insert(consumer_effects).values(
            consumer="effects",
            source=event.get_source(),
            event_id=event.get_id(),
            n=widget.n,
            pid=os.getpid(),
        )
    )


not_an_app = "not a ConsumerApp"


def _hanging_app(name: str) -> ConsumerApp:
    return ConsumerApp(
        name=name,
        retry=RetryPolicy(
            max_attempts=5, backoff=Backoff(base_s=0.05, cap_s=0.5), max_elapsed_s=20
        ),
        consumer_options={"session_timeout_ms": 6000, "heartbeat_interval_ms": 1000},
        retention_interval_s=None,
    )


# Handlers that never return (the default handler timeout, minutes, is far away): for the stop
# deadline. Each prints a line once it is running, so a test knows when to send SIGTERM.
hanging_app = _hanging_app("hanging")
hanging_thread_app = _hanging_app("hanging-thread")


@hanging_app.handler(WIDGET_TYPE, topic=TOPIC)
async def hang(widget: Widget) -> None:
    """Never return (cancellable)."""
    print(f"handler entered: widget {widget.n}", flush=True)
    await asyncio.Event().wait()


@hanging_thread_app.handler(WIDGET_TYPE, topic=TOPIC)
def hang_in_thread(widget: Widget) -> None:
    """Never return, in a worker thread (cannot be cancelled)."""
    print(f"handler entered: widget {widget.n}", flush=True)
    threading.Event().wait()


# Same name as effects_app (one inbox), a handler that raises a BaseException on widget 2:
# KeyboardInterrupt, or SystemExit when OUTBOXKIT_TEST_INTERRUPT is "SystemExit".
interrupting_app = ConsumerApp(
    name="effects",
    consumer_options={"session_timeout_ms": 6000, "heartbeat_interval_ms": 1000},
    retention_interval_s=None,
)


@interrupting_app.handler(WIDGET_TYPE, topic=TOPIC)
async def interrupt_on_two(widget: Widget, event: CloudEvent, session: AsyncSession) -> None:
    """Like :func:`record_widget`, but widget 2 raises KeyboardInterrupt (or SystemExit)."""
    if widget.n == 2:
        if os.environ.get("OUTBOXKIT_TEST_INTERRUPT") == "SystemExit":
            raise SystemExit(3)
        raise KeyboardInterrupt
    await record_widget(widget, event, session)
