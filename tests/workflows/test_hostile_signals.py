"""Signals from anyone who can produce to the signals topic, on real Kafka and PostgreSQL.

Oversized attributes are recorded as rejected at the first attempt (they used to be retried as
unknown database errors, holding the partition ~1.5 s each); a record that merely carries the
engine's timer type and source fires nothing, while the engine's own timer still does.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from typing import Any

from outboxkit.outbox import new_event
from outboxkit.outbox.tables import outbox_events
from outboxkit.workflows.events import REMINDER, TIMER
from outboxkit.workflows.tables import workflow_signals
from sqlalchemy import select

from tests.support import workflows as wf
from tests.support.consumers import binary_record, produce, running
from tests.support.kafka import wait_for

T = wf.TENANT


def _oversized(record: Any, n: int) -> Any:
    """An approval with one attribute longer than its column (four kinds, in turn)."""
    extensions = {
        "workflowid": record.workflow_id,
        "tenantid": record.tenant,
        "correlationid": record.wait.correlation,
        "requesthash": record.wait.request_hash,
        "authsig": "0" * 64,
    }
    source = wf.APPROVALS
    kind = n % 4
    if kind == 0:
        extensions["correlationid"] = "c" * 201
    elif kind == 1:
        extensions["requesthash"] = "h" * 65
    elif kind == 2:
        extensions["tenantid"] = "t" * 65
    else:
        source = "s" * 256
    return new_event("approval.granted", source, {"by": "x"}, id=f"big-{n}", extensions=extensions)


async def _rows(engine: Any, *where: Any) -> list[Any]:
    async with engine.sessions() as session:
        return list((await session.execute(select(workflow_signals).where(*where))).mappings())


async def test_200_oversized_signals_are_rejected_at_once_and_the_next_one_is_applied(
    pg_url: str, kafka_bootstrap: str, topic: str
) -> None:
    async with wf.engine_on(pg_url, signals_topic=topic, events_topic=f"{topic}-ev") as engine:
        await wf.start(engine, "R-big", wf.refund_input("http://127.0.0.1:9"))
        await wf.until_state(engine, "R-big", {"await_approval"})
        record = await wf._until_waiting(engine, "R-big")
        request = wf.approval_request(record.data["input"], record.data["record_version"])
        attempts: Counter[str] = Counter()
        deliver = engine.deliver

        async def counted(session: Any, event: Any) -> Any:
            attempts[event.get_id()] += 1
            return await deliver(session, event)

        engine.deliver = counted  # type: ignore[method-assign]
        bad = [_oversized(record, n) for n in range(200)]
        good = wf.approval(record, request, id="good")
        await produce(kafka_bootstrap, topic, [binary_record(e) for e in [*bad, good]], 0)
        async with running(engine.consumer_app(), pg_url, kafka_bootstrap):
            applied = await wait_for(
                lambda: _rows(engine, workflow_signals.c.event_id == "good"),
                lambda rows: bool(rows) and rows[0]["outcome"] == "accepted",
                90,
                "the good signal behind 200 oversized ones",
            )
        assert applied[0]["principal"] == wf.APPROVALS
        rejected = await _rows(engine, workflow_signals.c.outcome == "rejected")
        assert len(rejected) == 200
        assert all("longer than its column" in row["reason"] for row in rejected)
        reasons = Counter(row["reason"].split(" is ")[0] for row in rejected)
        assert reasons == {"correlationid": 50, "requesthash": 50, "tenantid": 50, "source": 50}
        assert max(attempts.values()) == 1 and len(attempts) == 201


def _timer_record(row: Any) -> tuple[bytes | None, bytes, list[tuple[str, bytes]]]:
    """The Kafka record the relay publishes for an outbox row (binary mode)."""
    headers = [(name, value.encode("utf-8")) for name, value in json.loads(row.headers).items()]
    return row.kafka_key, row.payload, headers


async def _outbox(engine: Any, type: str) -> list[Any]:
    async with engine.sessions() as session:
        query = select(outbox_events).where(outbox_events.c.type == type)
        return list((await session.execute(query.order_by(outbox_events.c.id))).all())


async def test_a_forged_timer_fires_nothing_and_the_engines_own_still_fires(
    pg_url: str, kafka_bootstrap: str, topic: str
) -> None:
    async with wf.engine_on(pg_url, signals_topic=topic, events_topic=f"{topic}-ev") as engine:
        input = wf.refund_input("http://127.0.0.1:9", remind_every_s=600)
        await wf.start(engine, "R-t", input)
        await wf.until_state(engine, "R-t", {"await_approval"})
        record = await wf._until_waiting(engine, "R-t")
        assert record.wait is not None
        correlation = record.wait.correlation
        (own,) = [r for r in await _outbox(engine, TIMER) if r.event_id.endswith("/reminder/1")]
        source = engine.sink.source
        extensions = {"workflowid": "R-t", "tenantid": T, "correlationid": correlation}

        def forged(number: int, **extra: Any) -> Any:
            return new_event(
                TIMER,
                source,
                {"kind": "reminder", "number": number},
                id=f"{T}/{correlation}/reminder/{number}",
                extensions={**extensions, **extra},
            )

        forgeries = [forged(7), forged(1, authsig="0" * 64), forged(8, authsig=uuid.uuid4().hex)]
        records = [binary_record(e) for e in forgeries] + [_timer_record(own)]
        await produce(kafka_bootstrap, topic, records, 0)
        async with running(engine.consumer_app(), pg_url, kafka_bootstrap):
            reminders = await wait_for(
                lambda: _outbox(engine, REMINDER), lambda rows: len(rows) >= 1, 60, "a reminder"
            )
            signals = await wait_for(
                lambda: _rows(engine, workflow_signals.c.type == TIMER),
                lambda rows: len(rows) >= 1,
                60,
                "the timer's record",
            )
        assert [r.event_id for r in reminders] == [f"{T}/{correlation}/reminded/1"]
        # the forgeries were refused before being recorded (dead-lettered at once), so the
        # forgery with the genuine timer's id did not make the genuine one a duplicate
        assert [(s["event_id"], s["outcome"]) for s in signals] == [
            (own.event_id, "timer"),
        ]
