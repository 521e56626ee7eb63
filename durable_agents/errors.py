"""What a durable agent run raises when the ledger refuses to go on."""

from __future__ import annotations

from outboxkit.actions.errors import ActionError


class AgentRunError(ActionError):
    """Base class of the errors of :mod:`outboxkit.agents`."""


class DefinitionChangedError(AgentRunError):
    """The run was recorded under another definition: another version, prompt, instructions,
    tools, or a model request that differs from the recorded one at the same position.

    Resuming it with this code could take the run somewhere its history did not go; finish it
    on the definition it started on, or start a new run.
    """


class ApprovalRefusedError(AgentRunError):
    """An approval that does not cover the call: other arguments, expired, or none recorded.

    The refusal is recorded in the ledger (and published) before this is raised; the tool's
    effect did not run.
    """
