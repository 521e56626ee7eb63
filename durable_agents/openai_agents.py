"""OpenAI Agents SDK on the action ledger: tool calls at most once, approvals bound to arguments.

::

    refund = ledger_tool(refund_fn, target=("charge_id",), reconciler=lookup, needs_approval=True)
    agent = Agent(name="support", tools=[refund], model=model)
    runner = DurableRunner(agent, version=1)
    result = await runner.run(run, ticket_text)     # RunFinished or RunWaiting
    await decide(run, call_id, args_hash=shown, by="alice")   # any process, days later
    result = await runner.run(run, ticket_text)     # another process: resumes the stored state

A :func:`ledger_tool` is a ``FunctionTool`` whose ``on_invoke_tool`` runs through the ledger
under ``(tenant, run id, tool, target or arguments hash, version)``. ``needs_approval``
interruptions become the durable approvals of :mod:`outboxkit.agents.approvals`; the run's
``RunState`` is stored in the ledger with them, so a run resumes in another process. The
agent's model is wrapped in :class:`DurableModel`: each request is recorded under the run id and
its position, so a run started again (a crash, a redeploy) replays the answers it already had
and asks the model only for the requests it never got an answer to.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from agents import (
    Agent,
    AgentOutputSchemaBase,
    FunctionTool,
    Handoff,
    Model,
    ModelResponse,
    ModelSettings,
    ModelTracing,
    Runner,
    RunState,
    Tool,
    TResponseInputItem,
    function_tool,
)
from agents.exceptions import UserError
from agents.models.multi_provider import MultiProvider
from agents.tool_context import ToolContext
from outboxkit.actions.errors import ActionError
from outboxkit.actions.hashing import canonical_json, params_hash
from outboxkit.actions.reconcile import Reconciler
from outboxkit.agents.approvals import (
    DEFAULT_APPROVAL_TTL_S,
    PendingApproval,
    check_approved,
    decision_of,
    request_approval,
)
from outboxkit.agents.ledger import (
    AgentRun,
    current_run,
    record_once,
    record_outcome,
    record_start,
    recorded_model_request,
    run_effect,
    using_run,
)
from pydantic import TypeAdapter
from pydantic_core import to_jsonable_python

STATE = "agent.run.state"
_RESPONSE: TypeAdapter[ModelResponse] = TypeAdapter(ModelResponse)


class DurableModel(Model):
    """The agent's model, each request recorded under the run id and its position.

    The position is the length of the input (the conversation grows by every answer and tool
    output), so a run started again, or resumed from its stored ``RunState``, numbers its
    requests as the first run did. The parameters are the hash of the instructions, the input
    and the offered tools: another request at a recorded position is a
    :class:`~outboxkit.agents.DefinitionChangedError`. An answered request is replayed from
    the ledger; one that failed or was interrupted by a crash is asked again.
    """

    def __init__(self, wrapped: Model, run: AgentRun, agent_name: str) -> None:
        self.wrapped = wrapped
        self.run = run
        self.agent_name = agent_name
        self.model_calls = 0
        """How many requests this process sent to the wrapped model (not replays)."""

    async def get_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Tool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: Any | None,
    ) -> ModelResponse:
        items = to_jsonable_python(input, fallback=str)
        position = len(items) if isinstance(items, list) else 0
        offered = [
            {"name": t.name, "schema": getattr(t, "params_json_schema", None)} for t in tools
        ]
        fingerprint = {
            "instructions": params_hash(system_instructions),
            "input": params_hash(items),
            "tools": params_hash(to_jsonable_python(offered)),
            "handoffs": params_hash(sorted(h.tool_name for h in handoffs)),
        }

        async def ask() -> Any:
            self.model_calls += 1
            response = await self.wrapped.get_response(
                system_instructions,
                input,
                model_settings,
                tools,
                output_schema,
                handoffs,
                tracing,
                previous_response_id=previous_response_id,
                conversation_id=conversation_id,
                prompt=prompt,
            )
            return _RESPONSE.dump_python(response, mode="json", by_alias=True)

        answer = await recorded_model_request(self.run, self.agent_name, position, fingerprint, ask)
        return _RESPONSE.validate_python(answer)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        """Not durable: a streamed answer cannot be replayed as it was received."""
        raise NotImplementedError("DurableRunner runs the model without streaming")


def ledger_tool(
    function: Callable[..., Awaitable[Any]],
    *,
    target: Sequence[str] = (),
    reconciler: Reconciler | None = None,
    version: str | int = 1,
    action_type: str | None = None,
    needs_approval: bool = False,
    timeout_s: float | None = None,
) -> FunctionTool:
    """``function`` as a ``FunctionTool`` whose every call goes through the ledger.

    It runs inside :meth:`DurableRunner.run` (which names the run); ``current_call()`` gives
    the key to send downstream. With ``needs_approval`` it runs only if a recorded decision
    covers these exact arguments and its request has not expired (checked now).
    """
    tool = function_tool(function, needs_approval=needs_approval)
    name = tool.name
    kind = action_type or f"agent.tool.{name}"
    invoke = tool.on_invoke_tool

    async def on_invoke(ctx: ToolContext[Any], arguments: str) -> Any:
        run = current_run()
        args = json.loads(arguments or "{}")
        if needs_approval:
            await check_approved(run, ctx.tool_call_id, args)
        if target:
            target_id = canonical_json([args.get(part) for part in target])
        else:
            target_id = params_hash(args)
        key = run.key(f"tool:{name}", kind, target_id, version)

        async def call() -> Any:
            return to_jsonable_python(await invoke(ctx, arguments))

        outcome = await run_effect(
            run, key, kind, args, call, tool=name, reconciler=reconciler, timeout_s=timeout_s
        )
        return outcome.result

    return dataclasses.replace(tool, on_invoke_tool=on_invoke)


@dataclass(frozen=True)
class RunFinished:
    """The run ended with ``output`` (the final output, as JSON)."""

    output: Any


@dataclass(frozen=True)
class RunWaiting:
    """The run waits for approvals; its state is stored. Decide, then run it again."""

    approvals: list[PendingApproval]


class DurableRunner:
    """Runs (and resumes) one agent's runs durably; ``version`` names its definition."""

    def __init__(
        self,
        agent: Agent[Any],
        *,
        version: str | int,
        approval_ttl_s: float = DEFAULT_APPROVAL_TTL_S,
        max_turns: int = 10,
    ) -> None:
        self.agent = agent
        self.version = version
        self.approval_ttl_s = approval_ttl_s
        self.max_turns = max_turns
        self.model_calls = 0
        """Requests the last :meth:`run` sent to the model (0 when all were replayed)."""

    def _durable_agent(self, run: AgentRun) -> tuple[Agent[Any], DurableModel]:
        model = self.agent.model
        if not isinstance(model, Model):
            model = MultiProvider().get_model(model)
        durable = DurableModel(model, run, self.agent.name)
        return self.agent.clone(model=durable), durable

    async def run(self, run: AgentRun, prompt: str) -> RunFinished | RunWaiting:
        """Run the agent on ``prompt``, or resume its stored state once decisions are in.

        What the ledger raised in a tool (``ApprovalRefusedError``, ``OperationConflictError``,
        ...) is raised as it is, not wrapped in the SDK's ``UserError``.
        """
        await record_start(run, self.agent.name, self.version, prompt)
        agent, model = self._durable_agent(run)
        try:
            with using_run(run):
                stored = await self._latest_state(run)
                if stored is None:
                    result = await Runner.run(agent, prompt, max_turns=self.max_turns)
                else:
                    _, state_json = stored
                    state = await RunState.from_json(agent, state_json)
                    waiting = await self._apply_decisions(run, state)
                    if waiting:
                        return RunWaiting(waiting)
                    result = await Runner.run(agent, state, max_turns=self.max_turns)
                while result.interruptions:
                    state = result.to_state()
                    await self._store_state(run, state)
                    waiting = await self._apply_decisions(run, state)
                    if waiting:
                        return RunWaiting(waiting)
                    result = await Runner.run(agent, state, max_turns=self.max_turns)
        except UserError as error:
            # the SDK wraps what a tool raised; the ledger's refusals come out as they are
            if isinstance(error.__cause__, ActionError):
                raise error.__cause__ from None
            raise
        finally:
            self.model_calls = model.model_calls
        output = to_jsonable_python(result.final_output)
        await record_outcome(run, self.agent.name, output)
        return RunFinished(output)

    async def _apply_decisions(self, run: AgentRun, state: RunState[Any]) -> list[PendingApproval]:
        waiting: list[PendingApproval] = []
        for item in state.get_interruptions():
            raw = item.raw_item
            call_id = str(getattr(raw, "call_id", None) or raw.get("call_id"))  # type: ignore[union-attr]
            arguments = getattr(raw, "arguments", None) or raw.get("arguments")  # type: ignore[union-attr]
            args = json.loads(arguments or "{}")
            pending = await request_approval(
                run, call_id, item.tool_name or "", args, self.approval_ttl_s
            )
            decision = await decision_of(run, call_id)
            if decision is None:
                waiting.append(pending)
            elif decision.approved:
                state.approve(item)
            else:
                state.reject(item)
        return waiting

    async def _store_state(self, run: AgentRun, state: RunState[Any]) -> int:
        position = await self._state_count(run)
        snapshot = state.to_json()
        await record_once(
            run,
            run.key(f"state:{position}", STATE, self.agent.name),
            STATE,
            {"position": position},
            lambda: {"state": snapshot},
            what=f"run state {position}",
        )
        return position

    async def _state_count(self, run: AgentRun) -> int:
        position = 0
        while await run.get(run.key(f"state:{position}", STATE, self.agent.name)) is not None:
            position += 1
        return position

    async def _latest_state(self, run: AgentRun) -> tuple[int, dict[str, Any]] | None:
        count = await self._state_count(run)
        if count == 0:
            return None
        record = await run.get(run.key(f"state:{count - 1}", STATE, self.agent.name))
        assert record is not None
        return count - 1, dict(record.result["state"])
