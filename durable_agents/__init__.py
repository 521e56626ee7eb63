"""Durable agents: agent frameworks' runs on the action ledger, every effect at most once.

:class:`AgentRun` is one run's access to the ledger (tenant, run id, clock). The pydantic-ai
durability (:mod:`outboxkit.agents.pydantic_ai`, extra ``agents``) records model answers and
routes tool calls through the ledger; approvals (:mod:`outboxkit.agents.approvals`) are bound
to the hash of the exact arguments. See ``docs/agents.md``.
"""

from outboxkit.agents.approvals import ApprovalDecision, PendingApproval, decide
from outboxkit.agents.errors import AgentRunError, ApprovalRefusedError, DefinitionChangedError
from outboxkit.agents.ledger import AgentRun, CallInfo, current_call, json_hash

__all__ = [
    "AgentRun",
    "AgentRunError",
    "ApprovalDecision",
    "ApprovalRefusedError",
    "CallInfo",
    "DefinitionChangedError",
    "PendingApproval",
    "current_call",
    "decide",
    "json_hash",
]
