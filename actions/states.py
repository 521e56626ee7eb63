"""Operation states and the one table of allowed transitions, checked in one place."""

from __future__ import annotations

from enum import StrEnum

from outboxkit.actions.errors import IllegalTransitionError


class State(StrEnum):
    """The state of an operation."""

    PENDING = "PENDING"
    """Not running; claimable by the next begin (new, failed transiently, or proven absent)."""
    RUNNING = "RUNNING"
    """Claimed by a worker under a lease; the side effect may be happening now."""
    SUCCEEDED = "SUCCEEDED"
    """Done; its result is returned to every later begin of the key."""
    FAILED_FINAL = "FAILED_FINAL"
    """Failed for good; its error is returned to every later begin of the key."""
    UNKNOWN = "UNKNOWN"
    """The side effect may or may not have happened; never retried until reconciled."""


# None is "no record yet". UNKNOWN -> UNKNOWN is the reconciler's "still unclear: flag for a
# person"; it changes needs_attention, not the state.
ALLOWED: dict[State | None, frozenset[State]] = {
    None: frozenset({State.PENDING}),
    State.PENDING: frozenset({State.RUNNING, State.FAILED_FINAL}),
    State.RUNNING: frozenset({State.SUCCEEDED, State.FAILED_FINAL, State.PENDING, State.UNKNOWN}),
    State.UNKNOWN: frozenset({State.SUCCEEDED, State.FAILED_FINAL, State.PENDING, State.UNKNOWN}),
    State.SUCCEEDED: frozenset(),
    State.FAILED_FINAL: frozenset(),
}

# After expiry a record in one of these states may be replaced by a new operation (a new
# generation) with the same key. RUNNING and UNKNOWN never expire: their side effect may
# have happened, and forgetting it would allow a second execution.
REPLACEABLE: frozenset[State] = frozenset({State.SUCCEEDED, State.FAILED_FINAL, State.PENDING})


def check_transition(current: State | None, target: State, *, new_generation: bool = False) -> None:
    """Raise :class:`IllegalTransitionError` unless ``current -> target`` is allowed.

    ``new_generation`` is the expiry replacement: an expired record in a
    :data:`REPLACEABLE` state starts over as PENDING.
    """
    if new_generation:
        if current in REPLACEABLE and target is State.PENDING:
            return
        raise IllegalTransitionError(f"an operation in state {current} cannot be replaced")
    if target not in ALLOWED[current]:
        raise IllegalTransitionError(
            f"an operation cannot go from {current or 'nothing'} to {target}"
        )
