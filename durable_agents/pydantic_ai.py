"""pydantic-ai durability on the action ledger: model answers replayed, tool calls at most once.

::

    durable = DurableAgent(agent, version=1, tools={"refund": DurableTool(reconciler=lookup)})
    run = AgentRun(sessions, tenant="acme", run_id=ticket_id)
    result = await durable.run(run, ticket_text)   # RunFinished or RunWaiting
    ...
    await decide(run, call_id, args_hash=shown_hash, by="alice")   # any process, days later
    result = await durable.run(run, ticket_text)   # resumes: replays, then runs the tool

Like pydantic-ai's Temporal and DBOS integrations, the agent runs under
``agent.override(model=..., toolsets=...)`` with its model wrapped in :class:`DurableModel`
(a ``WrapperModel``) and each toolset in :class:`DurableToolset` (a ``WrapperToolset``). A
run started again with the same run id re-runs the agent from its prompt: every model request
already answered is answered from the ledger (the model is not asked again), and every tool
call already made returns its stored result, so the run takes the path it took before. A
model request whose messages or tools differ from the recorded one at its position is a
:class:`DefinitionChangedError`, as is another ``version`` or prompt.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

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
    record_outcome,
    record_start,
    recorded_model_request,
    run_effect,
)
from pydantic_ai import Agent
from pydantic_ai._run_context import RunContext
from pydantic_ai.exceptions import ApprovalRequired, CallDeferred, ModelRetry
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelResponse,
    ToolCallPart,
)
from pydantic_ai.models import Model, ModelRequestParameters
from pydantic_ai.models.wrapper import WrapperModel
from pydantic_ai.settings import ModelSettings
from pydantic_ai.tools import DeferredToolRequests, DeferredToolResults, ToolDenied
from pydantic_ai.toolsets import AbstractToolset
from pydantic_ai.toolsets.abstract import ToolsetTool
from pydantic_ai.toolsets.wrapper import WrapperToolset
from pydantic_core import to_jsonable_python

OutputT = TypeVar("OutputT")
DepsT = TypeVar("DepsT")

# Fields pydantic-ai fills anew on every run; the rest of a message is what the model saw.
_VOLATILE = frozenset({"timestamp", "run_id", "conversation_id"})
_CONTROL_FLOW = (ModelRetry, CallDeferred, ApprovalRequired)


@dataclass(frozen=True)
class DurableTool:
    """How one tool's calls are keyed and reconciled.

    ``target`` names the arguments that identify the effect (a charge id): the same target
    with other arguments is the ledger's :class:`~outboxkit.actions.OperationConflictError`.
    Without it, the hash of all arguments identifies the call, so the same call twice in a run
    is one effect. ``reconciler`` looks an UNKNOWN call up by its key (``current_call()``'s
    ``idempotency_key`` was sent downstream). ``version`` is part of the key.
    """

    target: Sequence[str] = ()
    reconciler: Reconciler | None = None
    version: str | int = 1
    action_type: str | None = None
    timeout_s: float | None = None


def tool_key(run: AgentRun, name: str, args: dict[str, Any], config: DurableTool) -> str:
    """The operation key of a call of tool ``name`` with (JSON) ``args`` in ``run``."""
    if config.target:
        target = canonical_json([args.get(part) for part in config.target])
    else:
        target = params_hash(args)
    action_type = config.action_type or f"agent.tool.{name}"
    return run.key(f"tool:{name}", action_type, target, config.version)


def _stable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _stable(v) for k, v in value.items() if k not in _VOLATILE}
    if isinstance(value, list):
        return [_stable(v) for v in value]
    return value


def request_fingerprint(
    messages: list[ModelMessage], parameters: ModelRequestParameters
) -> dict[str, str]:
    """What identifies a model request: the messages and the tools it offers, hashed."""
    tools = [
        {"name": t.name, "schema": t.parameters_json_schema, "kind": t.kind}
        for t in [*parameters.function_tools, *parameters.output_tools]
    ]
    dumped = ModelMessagesTypeAdapter.dump_python(messages, mode="json")
    return {
        "messages": params_hash(_stable(dumped)),
        "tools": params_hash(to_jsonable_python(tools)),
        "output_mode": str(parameters.output_mode),
    }


class DurableModel(WrapperModel):
    """The run's model: each request recorded under the run id and its position in the run.

    The position is the number of answers before it in the messages, so a resumed run (also
    one continued after an approval) numbers its requests as the first run did. An answered
    position is replayed from the ledger; a request interrupted by a crash is asked again
    (it had no effect), and so is one that failed.
    """

    def __init__(self, wrapped: Model | str, run: AgentRun, agent_name: str) -> None:
        super().__init__(wrapped)
        self.run = run
        self.agent_name = agent_name
        self.model_calls = 0
        """How many requests this process sent to the wrapped model (not replays)."""

    async def request(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
    ) -> ModelResponse:
        position = sum(isinstance(m, ModelResponse) for m in messages)

        async def ask() -> Any:
            self.model_calls += 1
            response = await self.wrapped.request(
                messages, model_settings, model_request_parameters
            )
            return to_jsonable_python(ModelMessagesTypeAdapter.dump_python([response]))

        answer = await recorded_model_request(
            self.run,
            self.agent_name,
            position,
            request_fingerprint(messages, model_request_parameters),
            ask,
        )
        [response] = ModelMessagesTypeAdapter.validate_python(answer)
        assert isinstance(response, ModelResponse)
        return response


@dataclass
class DurableToolset(WrapperToolset[DepsT]):
    """A toolset whose every call goes through the ledger under the run's key for it.

    The key is ``(tenant, run id, tool, target or arguments hash, tool version)``. The tool
    returns its result's JSON form, on the first execution and on every replay alike, so the
    model sees the same thing both times. A tool that needs approval runs only if a recorded
    decision covers these exact arguments and its request has not expired (checked now).
    """

    run: AgentRun | None = None
    tools: Mapping[str, DurableTool] = field(default_factory=dict)

    async def call_tool(
        self,
        name: str,
        tool_args: dict[str, Any],
        ctx: RunContext[DepsT],
        tool: ToolsetTool[DepsT],
    ) -> Any:
        run = self.run
        assert run is not None
        config = self.tools.get(name, DurableTool())
        args = to_jsonable_python(tool_args)
        if tool.tool_def.kind == "unapproved":
            await check_approved(run, ctx.tool_call_id or "", _called_with(ctx))
        action_type = config.action_type or f"agent.tool.{name}"
        key = tool_key(run, name, args, config)

        async def call() -> Any:
            value = await self.wrapped.call_tool(name, tool_args, ctx, tool)
            return to_jsonable_python(value)

        outcome = await run_effect(
            run,
            key,
            action_type,
            args,
            call,
            tool=name,
            reconciler=config.reconciler,
            refusals=_CONTROL_FLOW,
            timeout_s=config.timeout_s,
        )
        return outcome.result


def _called_with(ctx: RunContext[Any]) -> dict[str, Any]:
    """The arguments the model sent in the call being run (what the approver was shown)."""
    for message in ctx.messages:
        if isinstance(message, ModelResponse):
            for part in message.parts:
                if isinstance(part, ToolCallPart) and part.tool_call_id == ctx.tool_call_id:
                    return dict(to_jsonable_python(part.args_as_dict()))
    return {}  # no such call: refused as another call's arguments


@dataclass(frozen=True)
class RunFinished(Generic[OutputT]):
    """The run ended with ``output``; ``messages`` is its whole conversation."""

    output: OutputT
    messages: list[ModelMessage]
    model_calls: int
    """Requests this process sent to the model (0 when everything was replayed)."""


@dataclass(frozen=True)
class RunWaiting:
    """The run waits for approvals; the process may exit. Decide, then run it again."""

    approvals: list[PendingApproval]
    model_calls: int


class DurableAgent(Generic[DepsT, OutputT]):
    """A pydantic-ai agent whose runs are durable in the action ledger.

    ``version`` names the definition (instructions, tools, output type): a run is resumed only
    on the version it started on. ``tools`` configures keys and reconcilers per tool name.
    ``approval_ttl_s`` is how long an approval request stays open (on the run's clock). The
    agent's ``output_type`` must include ``DeferredToolRequests`` when a tool requires
    approval.
    """

    def __init__(
        self,
        agent: Agent[DepsT, OutputT],
        *,
        version: str | int,
        tools: Mapping[str, DurableTool] | None = None,
        approval_ttl_s: float = DEFAULT_APPROVAL_TTL_S,
        name: str | None = None,
    ) -> None:
        self.agent = agent
        self.version = version
        self.tools = dict(tools or {})
        self.approval_ttl_s = approval_ttl_s
        self.name = name or agent.name or "agent"

    async def run(
        self,
        run: AgentRun,
        prompt: str,
        *,
        model: Model | str | None = None,
        deps: Any = None,
    ) -> RunFinished[Any] | RunWaiting:
        """Run (or resume) the agent under ``run``; the same call again resumes it."""
        await record_start(run, self.name, self.version, prompt)
        inner = model if model is not None else self.agent.model
        if inner is None:
            raise ValueError("no model: pass model= or give the agent one")
        durable_model = DurableModel(inner, run, self.name)
        toolsets: list[AbstractToolset[Any]] = [
            DurableToolset(toolset, run=run, tools=self.tools) for toolset in self.agent.toolsets
        ]
        history: list[ModelMessage] | None = None
        results: DeferredToolResults | None = None
        with self.agent.override(model=durable_model, toolsets=toolsets, tools=[]):
            while True:
                result = await self.agent.run(
                    None if history else prompt,
                    message_history=history,
                    deferred_tool_results=results,
                    deps=deps,
                )
                output = result.output
                if not isinstance(output, DeferredToolRequests):
                    break
                waiting, results = await self._decisions(run, output)
                if waiting:
                    return RunWaiting(waiting, durable_model.model_calls)
                history = result.all_messages()
        await record_outcome(run, self.name, to_jsonable_python(output))
        return RunFinished(output, result.all_messages(), durable_model.model_calls)

    def tool_key(self, run: AgentRun, name: str, args: dict[str, Any]) -> str:
        """The operation key a call of tool ``name`` with ``args`` has in ``run``."""
        return tool_key(run, name, to_jsonable_python(args), self.tools.get(name, DurableTool()))

    async def _decisions(
        self, run: AgentRun, requests: DeferredToolRequests
    ) -> tuple[list[PendingApproval], DeferredToolResults]:
        waiting: list[PendingApproval] = []
        results = DeferredToolResults()
        if requests.calls:
            raise NotImplementedError("external (CallDeferred) tools are not durable yet")
        for call in requests.approvals:
            args = to_jsonable_python(call.args_as_dict())
            pending = await request_approval(
                run, call.tool_call_id, call.tool_name, args, self.approval_ttl_s
            )
            decision = await decision_of(run, call.tool_call_id)
            if decision is None:
                waiting.append(pending)
            elif decision.approved:
                results.approvals[call.tool_call_id] = True
            else:
                results.approvals[call.tool_call_id] = ToolDenied(f"denied by {decision.by}")
        return waiting, results
