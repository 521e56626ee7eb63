"""Durable approvals: a person's decision bound to the hash of the exact arguments.

A tool call that needs approval is recorded as a request (the tool, the arguments' hash, and
when it expires, on the run's clock); the run then waits holding no process. A decision is
accepted only for the same arguments' hash and before the expiry, and checked again when the
tool is about to run: an approval for other arguments, an expired one, or none at all is
refused, and the refusal is recorded (and published) before :class:`ApprovalRefusedError` is
raised. The first decision recorded for a call is the decision; a different one later raises.

A request is flagged ``awaiting_decision`` in the ledger until its decision is recorded (in the
same transactions), so operators can list the calls waiting for a person
(:func:`outboxkit.ops.approvals.waiting_approvals`, ``outboxkit actions approvals``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from outboxkit.agents.errors import AgentRunError, ApprovalRefusedError, DefinitionChangedError
from outboxkit.agents.ledger import AgentRun, json_hash, record_once
from sqlalchemy.ext.asyncio import AsyncSession

DEFAULT_APPROVAL_TTL_S = 7 * 86400.0
REQUESTED = "agent.approval.requested"
DECIDED = "agent.approval.decided"
REFUSED = "agent.approval.refused"


@dataclass(frozen=True, slots=True)
class PendingApproval:
    """A tool call waiting for a person: approve ``args_hash`` before ``expires_at``."""

    tool_call_id: str
    tool: str
    args: dict[str, Any]
    args_hash: str
    expires_at: float


@dataclass(frozen=True, slots=True)
class ApprovalDecision:
    """A recorded decision on one tool call."""

    tool_call_id: str
    approved: bool
    args_hash: str
    by: str
    at: float


def _request_key(run: AgentRun, tool_call_id: str) -> str:
    return run.key(f"approval:{tool_call_id}", REQUESTED, tool_call_id)


def _decision_key(run: AgentRun, tool_call_id: str) -> str:
    return run.key(f"approval:{tool_call_id}", DECIDED, tool_call_id)


async def request_approval(
    run: AgentRun, tool_call_id: str, tool: str, args: dict[str, Any], ttl_s: float
) -> PendingApproval:
    """Record that ``tool`` with ``args`` waits for approval (once: the expiry is kept).

    The record (its result) also names the run and the call, for the operators' list. An
    approval open longer than the store's ``ttl_s`` is refused at once: the run's records could
    be forgotten while it waits."""
    if ttl_s > run.store.ttl_s:
        raise AgentRunError(
            f"approval_ttl_s ({ttl_s:g} s) is longer than the ledger's ttl_s "
            f"({run.store.ttl_s:g} s): the run's records could be deleted while it waits; "
            "give the run a store with ActionStore(ttl_s=...) at least as long"
        )
    args_hash = json_hash(args)
    key = _request_key(run, tool_call_id)

    async def flag(session: AsyncSession) -> None:
        await run.store.mark_awaiting_decision(session, run.tenant, key, True)

    record = await record_once(
        run,
        key,
        REQUESTED,
        {"tool": tool, "args_hash": args_hash},
        lambda: {
            "tool": tool,
            "args": args,
            "expires_at": run.clock() + ttl_s,
            "run_id": run.run_id,
            "tool_call_id": tool_call_id,
        },
        what=f"the approval request of call {tool_call_id!r}",
        then=flag,
    )
    return PendingApproval(tool_call_id, tool, args, args_hash, float(record.result["expires_at"]))


async def pending_request(run: AgentRun, tool_call_id: str) -> PendingApproval | None:
    """The recorded approval request of ``tool_call_id``, if any."""
    record = await run.get(_request_key(run, tool_call_id))
    if record is None or record.result is None:
        return None
    result = record.result
    return PendingApproval(
        tool_call_id,
        result["tool"],
        result["args"],
        json_hash(result["args"]),
        float(result["expires_at"]),
    )


async def decision_of(run: AgentRun, tool_call_id: str) -> ApprovalDecision | None:
    """The decision recorded for ``tool_call_id``, if any."""
    record = await run.get(_decision_key(run, tool_call_id))
    if record is None or record.result is None:
        return None
    r = record.result
    return ApprovalDecision(tool_call_id, bool(r["approved"]), r["args_hash"], r["by"], r["at"])


async def decide(
    run: AgentRun,
    tool_call_id: str,
    *,
    args_hash: str,
    by: str,
    approved: bool = True,
) -> ApprovalDecision:
    """Record ``by``'s decision on the call, for the arguments whose hash ``by`` saw.

    Refused (recorded, then :class:`ApprovalRefusedError`): no request for the call, another
    arguments' hash, or the request expired on the run's clock. The process that decides
    need not be the one that runs the agent; the run resumes with :meth:`resume` of its
    framework's durable agent, in any process.
    """
    request = await pending_request(run, tool_call_id)
    now = run.clock()
    if request is None:
        await refuse(run, tool_call_id, args_hash, by, "no approval was requested for this call")
    elif args_hash != request.args_hash:
        await refuse(run, tool_call_id, args_hash, by, "the approval is for other arguments")
    elif now > request.expires_at:
        await refuse(run, tool_call_id, args_hash, by, "the approval request expired")
    decision = {"approved": approved, "args_hash": args_hash, "by": by, "at": now}

    async def unflag(session: AsyncSession) -> None:
        await run.store.mark_awaiting_decision(
            session, run.tenant, _request_key(run, tool_call_id), False
        )

    try:
        record = await record_once(
            run,
            _decision_key(run, tool_call_id),
            DECIDED,
            {"approved": approved, "args_hash": args_hash},
            lambda: decision,
            what=f"the decision on call {tool_call_id!r}",
            then=unflag,
        )
    except DefinitionChangedError as error:
        raise AgentRunError(f"call {tool_call_id!r} was already decided otherwise") from error
    r = record.result
    return ApprovalDecision(tool_call_id, bool(r["approved"]), r["args_hash"], r["by"], r["at"])


async def check_approved(run: AgentRun, tool_call_id: str, args: dict[str, Any]) -> None:
    """Right before the effect: the call's decision covers these arguments and has not expired.

    Otherwise the refusal is recorded and :class:`ApprovalRefusedError` raised.
    """
    args_hash = json_hash(args)
    request = await pending_request(run, tool_call_id)
    decision = await decision_of(run, tool_call_id)
    if request is None or decision is None or not decision.approved:
        await refuse(run, tool_call_id, args_hash, "runtime", "no approval is recorded")
    assert request is not None and decision is not None
    if decision.args_hash != args_hash or request.args_hash != args_hash:
        await refuse(run, tool_call_id, args_hash, "runtime", "the approval is for other arguments")
    if run.clock() > request.expires_at:
        await refuse(
            run, tool_call_id, args_hash, "runtime", "the approval expired before the call"
        )


async def refuse(run: AgentRun, tool_call_id: str, args_hash: str, by: str, reason: str) -> None:
    """Record a refused approval (one record per call, arguments, actor and reason); raise."""
    offered = {"tool_call_id": tool_call_id, "args_hash": args_hash, "by": by, "reason": reason}
    await record_once(
        run,
        run.key(f"approval:{tool_call_id}:refused", REFUSED, json_hash(offered)),
        REFUSED,
        offered,
        lambda: offered,
        what="a refusal",
    )
    raise ApprovalRefusedError(f"call {tool_call_id!r} of run {run.run_id!r}: {reason}")
