"""Re-checks run when a signal resumes a waiting workflow, before it moves on."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from outboxkit.workflows.context import WorkflowContext

Recheck = Callable[["WorkflowContext"], Awaitable[str | None]]
"""``async def check(ctx) -> None | state``: ``None`` when the assumption still holds (a price,
a budget, a permission, a record version), else the state to go to instead (``needs_quote``).
A re-check reads outside systems through ``ctx.observe``, so what it saw is in the history."""
