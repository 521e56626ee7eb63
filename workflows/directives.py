"""What a state's handler returns: where the workflow goes next.

- :class:`Goto`: to another state now (its handler runs next);
- :class:`Wait`: stay in this state, with no process held, until a signal of one of the
  expected types arrives (then to the state ``on`` names) or the deadline passes;
- :class:`Complete`: to the terminal ``complete`` state, with a result.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Goto:
    """Go to ``state``; ``decision`` is the normalised decision recorded in the history."""

    state: str
    decision: Any = None


@dataclass(frozen=True, slots=True)
class Complete:
    """Finish in the terminal ``complete`` state with ``result`` (recorded and published)."""

    result: Any = None
    decision: Any = None


@dataclass(frozen=True, slots=True)
class Wait:
    """Wait durably for a signal, with a deadline.

    ``on`` maps each awaited signal type to the state it leads to. A signal is accepted only
    from one of ``sources`` (empty: any source the engine's verifier authenticates), carrying
    the wait's correlation (``ctx.correlation``) in its ``correlationid`` extension, and
    authenticated by the engine's verifier. With ``approval_for`` (the request as JSON), the
    signal must also carry the request's hash in ``requesthash``: an approval of another
    preview is refused, and the accepted approval binds that hash (see
    ``ctx.require_approval``).

    ``deadline_s`` after the wait began, the workflow goes to ``on_deadline`` (``expired`` or an
    escalation state such as ``human_review``); every ``remind_every_s`` before it a
    ``outboxkit.workflow.reminder`` event is published. The state's re-checks (see
    ``Workflow.state(rechecks=...)``) run when a signal resumes the workflow, before it moves on.
    """

    on: Mapping[str, str]
    deadline_s: float
    on_deadline: str = "expired"
    sources: Sequence[str] = ()
    remind_every_s: float | None = None
    approval_for: Any = None
    decision: Any = None

    def __post_init__(self) -> None:
        if not self.on:
            raise ValueError("a wait needs at least one signal type in 'on'")
        if not self.deadline_s > 0:
            raise ValueError("deadline_s must be positive: every wait has a deadline")
        if self.remind_every_s is not None and not self.remind_every_s > 0:
            raise ValueError("remind_every_s must be positive (or None)")


Next = Goto | Wait | Complete
"""What a handler returns."""
