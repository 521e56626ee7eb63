"""The workflow engine: start instances, take signals, and let operators cancel, resume, escalate.

Every public method works inside the caller's transaction (``session``), like the outbox: a
workflow starts exactly when the caller's change commits, and a signal is taken in the same
transaction as the consumer's inbox claim, so a redelivered event is never applied twice.
Running the states is the workers' job (:class:`~outboxkit.workflows.worker.WorkflowWorker`,
which calls :meth:`WorkflowEngine.run_due`).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Sequence
from typing import Any

from cloudevents.core.base import BaseCloudEvent
from outboxkit.actions.hashing import canonical_json, params_hash
from outboxkit.actions.states import State
from outboxkit.actions.store import ActionStore, new_holder
from outboxkit.consumers.app import ANY_TYPE, ConsumerApp
from outboxkit.outbox.errors import PermanentError
from outboxkit.outbox.secrecy import redact
from outboxkit.outbox.writer import Outbox
from outboxkit.workflows import matching, store
from outboxkit.workflows.advance import Advancer
from outboxkit.workflows.changes import Change, Sink, write
from outboxkit.workflows.definition import Registry, Workflow
from outboxkit.workflows.errors import (
    OperatorActionError,
    WorkflowConflictError,
    WorkflowNotFoundError,
)
from outboxkit.workflows.events import TIMER, reminder_event, reminder_timer
from outboxkit.workflows.metrics import SIGNALS
from outboxkit.workflows.records import (
    COMPENSATING,
    HUMAN_REVIEW,
    CompensationEntry,
    HistoryRecord,
    SignalRecord,
    Status,
    WaitSpec,
    WorkflowRecord,
)
from outboxkit.workflows.signatures import (
    CORRELATION_EXTENSION,
    REQUEST_HASH_EXTENSION,
    TENANT_EXTENSION,
    WORKFLOW_EXTENSION,
    SignalVerifier,
    event_data,
    signed_with,
)
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

DEFAULT_EVENTS_TOPIC = "outboxkit.workflow-events"
DEFAULT_SIGNALS_TOPIC = "outboxkit.workflow-signals"
_ATTRIBUTES = {
    "tenant": TENANT_EXTENSION,
    "workflow_id": WORKFLOW_EXTENSION,
    "event_id": "id",
    "correlation": CORRELATION_EXTENSION,
    "request_hash": REQUEST_HASH_EXTENSION,
}
"""The CloudEvents attribute of each column of a signal, where the names differ."""


class WorkflowEngine:
    """Runs workflow definitions on the outbox, the inbox and the agent-action ledger.

    ``sessions`` opens the engine's own transactions (the workers' steps); ``outbox`` carries
    its events: every history record to ``events_topic``, timers to ``signals_topic``, which
    :meth:`consumer_app` consumes back together with the signals other systems send there.
    ``verifier`` authenticates those signals (fail closed: with none, only the engine's own
    timers are taken, each signed with its wait's key). ``clock`` (seconds since the epoch)
    is the business clock of deadlines and timers; tests replace it. ``lease_s`` is how long a
    worker holds an instance it runs; keep it above the handlers' timeouts, or a slow run may be
    overtaken by another worker (safe, since effects are keyed, but wasted work).
    """

    def __init__(
        self,
        definitions: Sequence[Workflow],
        *,
        sessions: async_sessionmaker[AsyncSession],
        outbox: Outbox | None = None,
        events_topic: str = DEFAULT_EVENTS_TOPIC,
        signals_topic: str = DEFAULT_SIGNALS_TOPIC,
        source: str = "outboxkit/workflows",
        verifier: SignalVerifier | None = None,
        clock: Callable[[], float] = time.time,
        action_store: ActionStore | None = None,
        lease_s: float | None = None,
    ) -> None:
        self.registry = Registry(list(definitions))
        self.sessions = sessions
        self.verifier = verifier
        self.clock = clock
        self.action_store = action_store or ActionStore()
        redact_keys = tuple(key for definition in self.registry for key in definition.redact_keys)
        self.sink = Sink(
            outbox or Outbox(),
            events_topic,
            signals_topic,
            source,
            redact_keys,
        )
        longest = max(
            spec.budget.step_timeout_s
            for definition in self.registry
            for spec in definition.states.values()
        )
        self.lease_s = lease_s if lease_s is not None else 2 * longest + 10.0
        """How long a worker holds an instance (default: twice the longest handler timeout, plus
        10 s); an instance whose worker died is claimed again when it ends."""
        if self.lease_s <= 0:
            raise ValueError("lease_s must be positive")
        self._advancer = Advancer(self)

    def now_ms(self) -> int:
        """The business clock, in epoch milliseconds."""
        return int(self.clock() * 1000)

    async def start(
        self,
        session: AsyncSession,
        name: str,
        workflow_id: str,
        input: Any,
        *,
        tenant: str,
        owner: str | None = None,
    ) -> WorkflowRecord:
        """Start ``workflow_id`` on the newest version of ``name`` in the caller's transaction.

        Starting the same id again with the same input returns the existing instance (a
        retried request); with another input, or another workflow, it raises
        :class:`WorkflowConflictError`.
        """
        definition = self.registry.latest(name)
        now = self.now_ms()
        data = {"input": _json_value(input)}
        inserted = await store.insert_instance(
            session,
            {
                "tenant": tenant,
                "workflow_id": workflow_id,
                "name": definition.name,
                "version": definition.version,
                "state": "",
                "status": Status.RUNNABLE.value,
                "input_hash": params_hash(data["input"]),
                "data": store.dumps(data),
                "owner": owner,
                "run_at_ms": now,
                "attempts": 0,
                "compensations": "[]",
                "deadline_ms": None
                if definition.deadline_s is None
                else now + int(definition.deadline_s * 1000),
                "seq": 0,
                "entered_seq": 0,
                "state_since_ms": now,
                "created_ms": now,
                "updated_ms": now,
            },
        )
        current = await store.get(session, tenant, workflow_id, lock=True)
        assert current is not None
        if not inserted:
            if current.name != definition.name or current.input_hash != params_hash(data["input"]):
                raise WorkflowConflictError(
                    f"workflow {workflow_id!r} of tenant {tenant!r} exists with another input "
                    f"or definition ({current.name} v{current.version})"
                )
            return current
        change = Change(
            kind="start",
            to_state=definition.initial,
            status=Status.RUNNABLE,
            trigger={"kind": "start", "owner": owner},
            actor=owner or "start",
            run_at_ms=now,
            versions=dict(definition.versions) or None,
        )
        return await write(session, self.sink, current, change, now)

    async def deliver(self, session: AsyncSession, event: BaseCloudEvent) -> SignalRecord | None:
        """Take a signal addressed to an instance (``workflowid`` and ``tenantid`` extensions).

        Runs in the caller's transaction (a consumer's, with its inbox claim). The signal is
        recorded with its outcome (see :class:`~outboxkit.workflows.records.SignalRecord`);
        an accepted one makes the instance runnable. A signal seen before (same source and id)
        changes nothing and returns ``None``. An event without the extensions raises
        :class:`~outboxkit.outbox.errors.PermanentError` (a consumer dead-letters it).

        Before anything is read, a signal is checked against the table's columns: one with an
        attribute longer than its column is recorded at once as rejected, with the reason, the
        attribute kept as its start and its SHA-256 (:func:`~outboxkit.workflows.store.fit`).
        Its data is stored redacted (:func:`~outboxkit.outbox.secrecy.redact`).
        """
        workflow_id = event.get_extension(WORKFLOW_EXTENSION)
        tenant = event.get_extension(TENANT_EXTENSION)
        if not isinstance(workflow_id, str) or not isinstance(tenant, str):
            raise PermanentError(
                f"event of type {event.get_type()!r} names no workflow "
                f"(the {WORKFLOW_EXTENSION!r} and {TENANT_EXTENSION!r} extensions)"
            )
        now = self.now_ms()
        request_hash = event.get_extension(REQUEST_HASH_EXTENSION)
        correlation = event.get_extension(CORRELATION_EXTENSION)
        values: dict[str, Any] = {
            "tenant": tenant,
            "workflow_id": workflow_id,
            "source": event.get_source(),
            "event_id": event.get_id(),
            "type": event.get_type(),
            "correlation": correlation if isinstance(correlation, str) else None,
            "request_hash": request_hash if isinstance(request_hash, str) else None,
            "principal": None,
            "data": store.dumps(redact(event_data(event), self.sink.redact_keys)),
            "outcome": matching.PENDING,
            "received_ms": now,
        }
        lengths = store.SIGNAL_LENGTHS
        oversized = store.too_long(values, lengths)
        if oversized:
            refusal = "; ".join(
                f"{_ATTRIBUTES.get(name, name)} is {size} characters, longer than its column "
                f"({lengths[name]})"
                for name, size in oversized.items()
            )
            for name in oversized:
                values[name] = store.fit(values[name], lengths[name])
            return await self._record(session, values, matching.REJECTED, refusal)
        claims_timer = event.get_type() == TIMER and event.get_source() == self.sink.source
        if not claims_timer and self.verifier is not None:
            principal = self.verifier.verify(event)
            if principal is not None:
                values["principal"] = store.fit(principal, lengths["principal"])
        current = await store.get(session, tenant, workflow_id, lock=True)
        if claims_timer:
            wait = None if current is None else current.wait
            open_wait = wait is not None and wait.correlation == values["correlation"]
            if open_wait and wait is not None and not _signed_by(wait, event):
                # Refused before it is recorded: timer ids are predictable, and a forgery
                # recorded first would make the engine's own timer a duplicate.
                raise PermanentError("a timer not signed with its wait's key")
            values["data"] = None
        if not await store.insert_signal(session, values):
            SIGNALS.labels("duplicate").inc()
            return None
        signal = SignalRecord.from_row({**values, "reason": None, "consumed_seq": None})
        if claims_timer:
            outcome, reason = await self._timer(session, current, signal, event, now)
        elif signal.principal is None:
            outcome, reason = matching.REJECTED, "not authenticated"
        elif current is None:
            outcome, reason = matching.REJECTED, "no such workflow"
        elif current.terminal:
            outcome, reason = matching.LATE, f"the workflow has ended ({current.state})"
        elif current.wait is not None and current.status is Status.WAITING:
            outcome, reason = matching.judge(current.wait, signal)
        else:
            outcome, reason = matching.PENDING, None
        await store.set_signal_outcome(
            session, signal.source, signal.event_id, outcome, reason=reason
        )
        SIGNALS.labels(outcome).inc()
        if outcome == matching.ACCEPTED and current is not None:
            await store.update_instance(
                session, current.id, {"status": Status.RUNNABLE.value, "run_at_ms": now}
            )
            await store.notify(session, workflow_id)
        return SignalRecord.from_row(
            {**values, "outcome": outcome, "reason": reason, "consumed_seq": None}
        )

    async def _record(
        self, session: AsyncSession, values: dict[str, Any], outcome: str, reason: str
    ) -> SignalRecord | None:
        """Record a signal judged without reading the instance (``None`` if seen before)."""
        values = {**values, "outcome": outcome, "reason": reason}
        if not await store.insert_signal(session, values):
            SIGNALS.labels("duplicate").inc()
            return None
        SIGNALS.labels(outcome).inc()
        return SignalRecord.from_row({**values, "consumed_seq": None})

    async def _timer(
        self,
        session: AsyncSession,
        current: WorkflowRecord | None,
        signal: SignalRecord,
        event: BaseCloudEvent,
        now: int,
    ) -> tuple[str, str | None]:
        """A timer of the engine's own (its signature checked by :meth:`deliver` with the open
        wait's key, which only the instance's row holds): wake a due deadline, or publish a
        reminder."""
        wait = None if current is None else current.wait
        if current is None or wait is None or wait.correlation != signal.correlation:
            return matching.LATE, "its wait has ended"
        data = event_data(event)
        if isinstance(data, dict) and data.get("kind") == "reminder":
            number = int(data.get("number", 1))
            if wait.remind_every_ms is None or now >= wait.deadline_ms:
                return matching.LATE, "the deadline has passed"
            payload = {
                "workflow_id": current.workflow_id,
                "state": current.state,
                "number": number,
                "deadline_ms": wait.deadline_ms,
                "waiting_since_ms": wait.started_ms,
                "owner": current.owner,
            }
            reminder = reminder_event(
                self.sink.source,
                current.tenant,
                current.workflow_id,
                wait.correlation,
                number,
                payload,
            )
            await self.sink.outbox.add_async(session, reminder, topic=self.sink.events_topic)
            await self._schedule_reminder(session, current, number + 1)
            return matching.TIMER, f"reminder {number} published"
        if now >= wait.deadline_ms and current.status is Status.WAITING:
            await store.notify(session, current.workflow_id)  # the workers' scan takes it
        return matching.TIMER, "deadline timer"

    async def _schedule_reminder(
        self, session: AsyncSession, current: WorkflowRecord, number: int
    ) -> None:
        assert current.wait is not None
        sink = self.sink
        timer = reminder_timer(
            sink.source,
            sink.signals_topic,
            current.tenant,
            current.workflow_id,
            current.wait,
            number,
        )
        if timer is not None:
            event, topic, deliver_at = timer
            await sink.outbox.add_async(session, event, topic=topic, deliver_at=deliver_at)

    def consumer_app(self, name: str = "outboxkit-workflows", **options: Any) -> ConsumerApp:
        """A consumer of the signals topic that hands every event to :meth:`deliver`.

        Run it like any consumer (``outboxkit consume module:app``): the inbox deduplicates
        redeliveries in the same transaction, and events that name no workflow are
        dead-lettered with the reason.
        """
        app = ConsumerApp(name, **options)

        @app.handler(ANY_TYPE, topic=self.sink.signals_topic)
        async def on_signal(event: BaseCloudEvent, session: AsyncSession) -> None:
            await self.deliver(session, event)

        return app

    async def run_due(self, *, holder: str | None = None, limit: int = 10) -> int:
        """Claim up to ``limit`` instances with work due and advance each one step.

        Returns how many were claimed. Workers call it in a loop; so may a test.
        """
        return await self._advancer.run_due(holder or new_holder(), limit)

    async def cancel(
        self, session: AsyncSession, tenant: str, workflow_id: str, *, by: str, reason: str
    ) -> WorkflowRecord:
        """Ask for a cancel; a worker carries it out (cooperatively) at the instance's next step.

        - waiting (queued, for a signal or in human_review): compensations run in reverse
          order, then ``cancelled``;
        - running: effects not yet started are not started (``cancellable`` steps), those done
          are compensated, at the end of the handler's run;
        - with an unknown outcome open: the step is reconciled first; if it took effect it is
          compensated, if it is proven absent nothing is, and if it stays unclear the instance
          goes to human_review with the cancel still asked for.
        """
        current = await self._get(session, tenant, workflow_id)
        if current.terminal:
            raise OperatorActionError(f"workflow {workflow_id!r} has ended ({current.state})")
        if current.cancel_requested_ms is None:
            values: dict[str, Any] = {
                "cancel_requested_ms": self.now_ms(),
                "cancel_reason": f"{by}: {reason}"[:500],
            }
            if current.status is not Status.RUNNABLE:
                values.update(status=Status.RUNNABLE.value, run_at_ms=self.now_ms())
            await store.update_instance(session, current.id, values)
            await store.notify(session, workflow_id)
        return await self._get(session, tenant, workflow_id)

    async def resume(
        self,
        session: AsyncSession,
        tenant: str,
        workflow_id: str,
        *,
        by: str,
        reason: str,
        to_state: str | None = None,
    ) -> WorkflowRecord:
        """An operator's decision in human_review: go on in ``to_state`` (default: where it was).

        Resolve an unknown operation first (``outboxkit actions resolve``): the state runs again
        and meets the resolved operation, or comes back here if it is still unknown.
        """
        current = await self._get(session, tenant, workflow_id, lock=True)
        if current.state != HUMAN_REVIEW:
            raise OperatorActionError(
                f"workflow {workflow_id!r} is in {current.state!r}, not in human_review"
            )
        target = to_state or current.review_from
        definition = self.registry.get(current.name, current.version)
        if target is None or not definition.knows(target) or target == HUMAN_REVIEW:
            raise OperatorActionError(f"cannot resume {workflow_id!r} in state {target!r}")
        now = self.now_ms()
        change = Change(
            kind="operator",
            to_state=target,
            status=Status.RUNNABLE,
            trigger={"kind": "operator", "action": "resume", "by": by},
            actor=by,
            decision={"action": "resume", "reason": reason},
            run_at_ms=now,
            review_from=None,
            open_unknown=current.open_unknown,
        )
        if target == COMPENSATING and current.compensations:
            change.compensations = await self._retry_compensation(session, current)
        return await write(session, self.sink, current, change, now)

    async def _retry_compensation(
        self, session: AsyncSession, current: WorkflowRecord
    ) -> list[CompensationEntry]:
        """The stack to resume with: a compensation that failed for good gets a new round.

        One whose outcome is unknown must be resolved first (``outboxkit actions resolve``):
        a new round could undo twice.
        """
        *rest, top = current.compensations
        operation = await self.action_store.get(session, current.tenant, top.key)
        if operation is not None and operation.state is State.UNKNOWN:
            raise OperatorActionError(
                f"compensation {top.key!r} has an unknown outcome: resolve it first"
            )
        if operation is not None and operation.state is State.FAILED_FINAL:
            top = dataclasses.replace(top, round=top.round + 1)
        return [*rest, top]

    async def escalate(
        self, session: AsyncSession, tenant: str, workflow_id: str, *, by: str, reason: str
    ) -> WorkflowRecord:
        """Send an instance to human_review now (what it waited for is no longer awaited)."""
        current = await self._get(session, tenant, workflow_id, lock=True)
        if current.terminal or current.state == HUMAN_REVIEW:
            raise OperatorActionError(f"workflow {workflow_id!r} is in {current.state!r}")
        now = self.now_ms()
        change = Change(
            kind="operator",
            to_state=HUMAN_REVIEW,
            status=Status.WAITING,
            trigger={"kind": "operator", "action": "escalate", "by": by},
            actor=by,
            decision={"action": "escalate", "reason": reason},
            review_from=current.state if current.state != COMPENSATING else COMPENSATING,
            open_unknown=current.open_unknown,
            last_error=current.last_error,
            failure_class=current.failure_class,
        )
        return await write(session, self.sink, current, change, now)

    async def get(
        self, session: AsyncSession, tenant: str, workflow_id: str
    ) -> WorkflowRecord | None:
        """The instance, or ``None``."""
        return await store.get(session, tenant, workflow_id)

    async def history(
        self, session: AsyncSession, tenant: str, workflow_id: str
    ) -> list[HistoryRecord]:
        """The instance's history, oldest first."""
        return await store.history(session, tenant, workflow_id)

    async def signals(
        self, session: AsyncSession, tenant: str, workflow_id: str
    ) -> list[SignalRecord]:
        """The signals addressed to the instance, in arrival order."""
        return await store.signals(session, tenant, workflow_id)

    async def _get(
        self, session: AsyncSession, tenant: str, workflow_id: str, *, lock: bool = False
    ) -> WorkflowRecord:
        current = await store.get(session, tenant, workflow_id, lock=lock)
        if current is None:
            raise WorkflowNotFoundError(f"no workflow {workflow_id!r} of tenant {tenant!r}")
        return current


def _signed_by(wait: WaitSpec, event: BaseCloudEvent) -> bool:
    """Whether a timer is signed with ``wait``'s key (a wait stored without one signs none)."""
    return bool(wait.timer_secret) and signed_with(event, [bytes.fromhex(wait.timer_secret)])


def _json_value(value: Any) -> Any:
    """``value`` as plain JSON values (pydantic models dumped), refusing what JSON cannot hold."""
    return json.loads(canonical_json(value))
