"""LangGraph on the action ledger: tasks at most once, safe when a node runs again from its start.

LangGraph resumes an interrupted node by running it again from its first line, so everything a
node did before its ``interrupt()`` happens again, unless it goes through the ledger: a
:func:`ledger_task` call returns its stored result by key the second time. A task with
``needs_approval`` records a durable approval request bound to its arguments' hash and calls
``interrupt({...})``; the graph is resumed with ``Command(resume={"args_hash": ..., "by":
...})``, which is recorded as the decision and checked again right before the effect. An
answer for other arguments or after the expiry is refused and recorded, and the graph
interrupts again (``"refused"`` in the payload says why). Run the graph inside
``using_run(AgentRun(..., run_id=thread_id))``.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from langgraph.types import interrupt
from outboxkit.actions.hashing import canonical_json, params_hash
from outboxkit.actions.reconcile import Reconciler
from outboxkit.actions.states import State
from outboxkit.agents.approvals import (
    DEFAULT_APPROVAL_TTL_S,
    check_approved,
    decide,
    decision_of,
    request_approval,
)
from outboxkit.agents.errors import ApprovalRefusedError
from outboxkit.agents.ledger import AgentRun, current_run, run_effect
from pydantic_core import to_jsonable_python


def ledger_task(
    function: Callable[..., Awaitable[Any]],
    *,
    name: str | None = None,
    target: Sequence[str] = (),
    reconciler: Reconciler | None = None,
    version: str | int = 1,
    needs_approval: bool = False,
    approval_ttl_s: float = DEFAULT_APPROVAL_TTL_S,
) -> Callable[..., Awaitable[Any]]:
    """``function`` (called with keyword arguments) at most once per run and arguments.

    Its result comes back as JSON, the first time and on every replay alike.
    """
    task = name or function.__name__
    kind = f"agent.tool.{task}"

    @functools.wraps(function)
    async def call(**kwargs: Any) -> Any:
        run = current_run()
        args = to_jsonable_python(kwargs)
        target_id = canonical_json([args.get(p) for p in target]) if target else params_hash(args)
        key = run.key(f"tool:{task}", kind, target_id, version)
        if needs_approval:
            call_id = f"{task}:{target_id}"[:100]
            await _approved(run, call_id, task, args, approval_ttl_s, key)
        outcome = await run_effect(
            run,
            key,
            kind,
            args,
            lambda: _json(function(**kwargs)),
            tool=task,
            reconciler=reconciler,
        )
        return outcome.result

    return call


async def _approved(
    run: AgentRun, call_id: str, task: str, args: dict[str, Any], ttl_s: float, key: str
) -> None:
    """Wait (``interrupt()``) until an answer is accepted as the decision on ``call_id``.

    A refused answer (other arguments, expired) is recorded and the graph interrupts again,
    the refusal in the payload: LangGraph hands a re-run node the answers of its earlier
    interrupts in order, so each re-run makes the same interrupts, refuses the same answers,
    and reaches the same decision (the recorded one) without a person being asked again.
    """
    pending = await request_approval(run, call_id, task, args, ttl_s)
    refusal: str | None = None
    while True:
        answer = interrupt(
            {"tool_call_id": call_id, "tool": task, "args": args, "args_hash": pending.args_hash,
             "expires_at": pending.expires_at, "refused": refusal}
        )  # fmt: skip
        shown = str(answer.get("args_hash", ""))
        decision = await decision_of(run, call_id)
        if decision is None or decision.args_hash != shown:
            try:
                decision = await decide(
                    run,
                    call_id,
                    args_hash=shown,
                    by=str(answer.get("by", "unknown")),
                    approved=bool(answer.get("approved", True)),
                )
            except ApprovalRefusedError as error:
                refusal = str(error)
                continue
        break
    if not decision.approved:
        raise ApprovalRefusedError(f"{task} was denied by {decision.by}")
    done = await run.get(key)
    if done is None or done.state is not State.SUCCEEDED:  # a replay needs no live approval
        await check_approved(run, call_id, args)


async def _json(result: Awaitable[Any]) -> Any:
    return to_jsonable_python(await result)
