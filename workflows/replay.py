"""Replaying a stored history against the code of a definition: is the code still compatible?

Running instances continue on the version they started on, so the code of an old version must
keep deciding what it decided when their history was written. :func:`replay` runs again, for
every history record where a handler ran (``transition``, ``wait``, ``complete``, and the
state's re-checks for ``resume``), the handler of its ``from_state`` with a
:class:`ReplayRuntime`: effects and ``@step`` calls return the results recorded under their
key in that record, observations the recorded values in order, and the context's data is the
previous record's snapshot. Nothing is executed. What the handler decides now (the target
state, a wait's ``on`` map, the data, the decision, the result) is compared with the record;
every difference is a :class:`Mismatch` in the :class:`ReplayReport`.

Keep a few histories of every supported version as fixtures and replay them in a test
(``tests/workflows/test_replay.py``): an incompatible edit of an old version's handler fails
there, not in production. Histories are redacted (``redact_keys``, credentials): a handler
that reads a redacted field sees ``"[redacted]"`` on replay.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from outboxkit.actions.steps import Actions, Step
from outboxkit.outbox.secrecy import describe_error, redact
from outboxkit.workflows.context import EffectCall, EffectResult, WorkflowContext
from outboxkit.workflows.definition import Workflow
from outboxkit.workflows.directives import Complete, Goto, Wait
from outboxkit.workflows.errors import NondeterminismError
from outboxkit.workflows.records import (
    Approval,
    HistoryRecord,
    SignalRecord,
    Status,
    WorkflowRecord,
)

REPLAYED_KINDS = frozenset({"transition", "wait", "complete", "resume"})
"""History records written after a handler (or, for ``resume``, the re-checks) ran."""
_ENTERING_KINDS = frozenset({"resume", "operator", "approval_stale"})


@dataclass(frozen=True, slots=True)
class Mismatch:
    """One difference between a history record and what the code decides now."""

    seq: int
    state: str | None
    what: str
    """``target``, ``wait``, ``data``, ``decision``, ``result``, ``steps`` or ``error``."""
    recorded: Any
    replayed: Any

    def __str__(self) -> str:
        return (
            f"seq {self.seq} ({self.state}): {self.what} was {self.recorded!r}, "
            f"replay gives {self.replayed!r}"
        )


@dataclass(frozen=True, slots=True)
class ReplayReport:
    """What a replay found: the records replayed, those skipped, and every mismatch."""

    name: str
    version: int
    replayed: list[int] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)
    mismatches: list[Mismatch] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True if the code decides what the history recorded, everywhere it was replayed."""
        return not self.mismatches

    def __str__(self) -> str:
        lines = [
            f"{self.name} v{self.version}: {len(self.replayed)} records replayed, "
            f"{len(self.mismatches)} mismatches"
        ]
        lines += [f"  {mismatch}" for mismatch in self.mismatches]
        return "\n".join(lines)


class ReplayRuntime:
    """A :class:`~outboxkit.workflows.context.ContextRuntime` answering from one history record.

    Effects and steps get the result recorded under their key (a key the record does not hold
    raises :class:`NondeterminismError`); observations get the recorded values of their name,
    in order. Nothing runs for real.
    """

    def __init__(self, record: HistoryRecord, *, tenant: str, run_id: str) -> None:
        self.record = record
        self.tenant = tenant
        self.run_id = run_id
        self.used: set[str] = set()
        self._observed: dict[str, list[Any]] = {}
        for observation in record.observations:
            self._observed.setdefault(observation["name"], []).append(observation["value"])

    async def effect(self, ctx: WorkflowContext, call: EffectCall) -> EffectResult:
        """The recorded result of the effect ``call.key``."""
        return self._recorded(call.key, call.action_type)

    async def step(
        self,
        ctx: WorkflowContext,
        step: Step[Any, Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> EffectResult:
        """The recorded result of the ``@step`` call with these arguments (same key)."""
        with Actions(None, tenant=self.tenant, run_id=self.run_id):  # type: ignore[arg-type]
            key = step.key(*args, **kwargs)
        return self._recorded(key, step.action_type)

    async def observe(
        self, ctx: WorkflowContext, name: str, fetch: Callable[[], Awaitable[Any]]
    ) -> Any:
        """The next recorded value of the observation ``name``."""
        values = self._observed.get(name)
        if not values:
            raise NondeterminismError(
                f"observation {name!r} is not recorded (or not that often) at seq {self.record.seq}"
            )
        return values.pop(0)

    def unused(self) -> list[str]:
        """Keys of recorded steps the replayed handler did not ask for."""
        return [step["key"] for step in self.record.steps if step["key"] not in self.used]

    def _recorded(self, key: str, action_type: str) -> EffectResult:
        for step in self.record.steps:
            if step["key"] == key:
                if step["action_type"] != action_type:
                    raise NondeterminismError(
                        f"{key!r} was a {step['action_type']!r} at seq {self.record.seq}, "
                        f"now a {action_type!r}"
                    )
                self.used.add(key)
                return EffectResult(
                    key, step["result"], bool(step["executed"]), step.get("external_ref")
                )
        recorded = [step["key"] for step in self.record.steps]
        raise NondeterminismError(
            f"effect {key!r} is not in the history at seq {self.record.seq} (recorded: {recorded})"
        )


async def replay(
    definition: Workflow,
    history: list[HistoryRecord],
    *,
    tenant: str = "replay",
    workflow_id: str = "replay",
) -> ReplayReport:
    """Replay ``history`` (one instance's, oldest first) against ``definition``'s code.

    ``tenant`` and ``workflow_id`` are the instance's (handlers build keys and correlations
    from them; the history records do not repeat them). Records of other workflows or
    versions are refused with ``ValueError``.
    """
    report = ReplayReport(definition.name, definition.version)
    for record in history:
        if record.name != definition.name or record.version != definition.version:
            raise ValueError(
                f"seq {record.seq} belongs to {record.name} v{record.version}, not {definition}"
            )
    walk = _Walk(definition, tenant, workflow_id)
    for previous, record in zip([None, *history], history, strict=False):
        if (
            previous is not None
            and record.kind in REPLAYED_KINDS
            and record.from_state in definition.states
        ):
            report.replayed.append(record.seq)
            report.mismatches.extend(await walk.replay(previous, record))
        else:
            report.skipped.append(record.seq)
        walk.follow(record)
    return report


class _Walk:
    """The instance as the history rebuilds it, record after record."""

    def __init__(self, definition: Workflow, tenant: str, workflow_id: str) -> None:
        self.definition = definition
        self.tenant = tenant
        self.workflow_id = workflow_id
        self.entered_seq = 0
        self.approval: Approval | None = None
        self.wait: Mapping[str, Any] | None = None
        self.keys = tuple(definition.redact_keys)

    def follow(self, record: HistoryRecord) -> None:
        """Take in what ``record`` changed: the visit of a state, the approval, the wait."""
        if record.to_state != record.from_state or record.kind in _ENTERING_KINDS:
            self.entered_seq = record.seq
        awaited = (self.wait or {}).get("awaiting_approval_of")
        if record.kind == "resume" and awaited:
            # as the engine does: an approval wait resumed binds the approval, unless a
            # re-check sent the workflow elsewhere (then no approval is held)
            self.approval = None
            if record.decision is None:
                self.approval = Approval(
                    record.from_state or "",
                    awaited,
                    record.trigger.get("type", ""),
                    record.trigger.get("principal"),
                    record.approval_ref or "",
                )
        elif record.kind == "approval_stale":
            self.approval = None
        wait = record.decision if record.kind == "wait" else None
        self.wait = wait if isinstance(wait, dict) else ({} if record.kind == "wait" else None)

    async def replay(self, previous: HistoryRecord, record: HistoryRecord) -> list[Mismatch]:
        """Run the handler (or re-checks) behind ``record`` again and compare."""
        state = record.from_state or ""
        runtime = ReplayRuntime(record, tenant=self.tenant, run_id=self.workflow_id)
        signal = self._signal(record) if record.kind == "resume" else None
        ctx = WorkflowContext(
            record=self._instance(state, previous.data, record),
            definition=self.definition,
            runtime=runtime,
            now_ms=record.at_ms,
            signal=signal,
            actor=record.actor,
        )
        found: list[Mismatch] = []

        def differ(what: str, recorded: Any, replayed: Any) -> None:
            if recorded != replayed:
                found.append(Mismatch(record.seq, state, what, recorded, replayed))

        try:
            if record.kind == "resume":
                ctx.data["last_signal"] = copy.deepcopy(record.data.get("last_signal"))
                target, decision = await self._recheck(ctx, record)
                differ("target", record.to_state, target)
                differ("decision", record.decision, decision)
            else:
                step = await self.definition.states[state].handler(ctx)
                self._compare_directive(record, step, ctx, differ)
        except Exception as error:  # a replayed handler must decide, not fail
            differ("error", None, describe_error(error, with_class=True))
            return found
        differ("data", record.data, self._redacted(ctx.data))
        unused = runtime.unused()
        if unused:
            differ("steps", [], unused)
        return found

    def _compare_directive(
        self,
        record: HistoryRecord,
        step: Any,
        ctx: WorkflowContext,
        differ: Callable[[str, Any, Any], None],
    ) -> None:
        if isinstance(step, Goto):
            differ("target", (record.kind, record.to_state), ("transition", step.state))
            differ("decision", record.decision, self._redacted(step.decision))
        elif isinstance(step, Complete):
            differ("target", (record.kind, record.to_state), ("complete", "complete"))
            differ("decision", record.decision, self._redacted(step.decision))
            differ("result", record.result, self._redacted(step.result))
        elif isinstance(step, Wait):
            differ("target", (record.kind, record.to_state), ("wait", ctx.state))
            recorded = record.decision if isinstance(record.decision, dict) else {}
            if "on" in recorded:
                differ("wait", recorded["on"], dict(step.on))
                differ("wait", recorded.get("on_deadline"), step.on_deadline)
            if record.deadline_ms is not None:
                deadline = record.at_ms + int(step.deadline_s * 1000)
                differ("wait", record.deadline_ms, deadline)
        else:  # not a directive (a handler returning anything else fails live as well)
            differ("target", record.to_state, repr(step))

    async def _recheck(self, ctx: WorkflowContext, record: HistoryRecord) -> tuple[str, Any]:
        spec = self.definition.states[ctx.state]
        on = (self.wait or {}).get("on")
        signal_type = record.trigger.get("type", "")
        target = on.get(signal_type, record.to_state) if isinstance(on, dict) else record.to_state
        for check in spec.rechecks:
            other = await check(ctx)
            if other is not None:
                return other, {"recheck": getattr(check, "__name__", str(check)), "to": other}
        return target, None

    def _signal(self, record: HistoryRecord) -> SignalRecord:
        trigger = record.trigger
        last = record.data.get("last_signal") or {}
        return SignalRecord(
            source=trigger.get("source", ""),
            event_id=trigger.get("id", ""),
            type=trigger.get("type", ""),
            correlation=f"{self.workflow_id}:{record.from_state}:{self.entered_seq}",
            request_hash=(self.wait or {}).get("awaiting_approval_of"),
            principal=trigger.get("principal"),
            data=last.get("data"),
            outcome="consumed",
            reason=None,
            received_ms=record.at_ms,
            consumed_seq=record.seq,
        )

    def _instance(self, state: str, data: dict[str, Any], record: HistoryRecord) -> WorkflowRecord:
        return WorkflowRecord(
            id=0,
            tenant=self.tenant,
            workflow_id=self.workflow_id,
            name=self.definition.name,
            version=self.definition.version,
            state=state,
            status=Status.RUNNABLE,
            input_hash="",
            data=copy.deepcopy(data),
            owner=None,
            run_at_ms=record.at_ms,
            wait=None,
            wait_deadline_ms=None,
            correlation=None,
            lease_holder=None,
            lease_expires_ms=None,
            attempts=max(record.attempt - 1, 0),
            first_failure_ms=None,
            failure_class=None,
            last_error=None,
            open_unknown=None,
            approval=self.approval,
            compensations=[],
            after_compensation=None,
            review_from=None,
            cancel_requested_ms=None,
            cancel_reason=None,
            deadline_ms=None,
            seq=record.seq - 1,
            entered_seq=self.entered_seq,
            state_since_ms=record.at_ms,
            created_ms=record.at_ms,
            updated_ms=record.at_ms,
        )

    def _redacted(self, value: Any) -> Any:
        """``value`` as the history would store it: JSON values, redacted."""
        return redact(json.loads(json.dumps(value)), self.keys)


def history_from_json(items: Iterable[Mapping[str, Any]]) -> list[HistoryRecord]:
    """History records from their JSON form (:meth:`HistoryRecord.to_json`, e.g. a fixture)."""
    records = []
    for item in items:
        values = dict(item)
        values["from_state"] = values.pop("from", values.get("from_state"))
        values["to_state"] = values.pop("to", values.get("to_state"))
        records.append(HistoryRecord(**values))
    return records
