"""Whether a signal may resume a wait: type, source, correlation, request hash, deadline."""

from __future__ import annotations

from outboxkit.workflows.records import SignalRecord, WaitSpec

ACCEPTED = "accepted"
PENDING = "pending"
REJECTED = "rejected"
LATE = "late"
CONSUMED = "consumed"
TIMER = "timer"


def judge(wait: WaitSpec, signal: SignalRecord) -> tuple[str, str | None]:
    """The outcome of ``signal`` against the open ``wait``, and the reason when it is refused.

    ``pending`` keeps a signal of a type this wait does not expect for a later wait (events may
    arrive before the workflow waits for them). A signal that answers an earlier visit of a
    state, or arrives after the deadline, is ``late``; a wrong source, a correlation this
    instance never issued or an approval of another request is ``rejected``.
    """
    if signal.received_ms > wait.deadline_ms:
        return LATE, "arrived after the wait's deadline"
    if signal.type not in wait.on:
        return PENDING, None
    if signal.correlation != wait.correlation:
        if _earlier_visit(signal.correlation, wait.correlation):
            return LATE, "answers an earlier wait of this workflow"
        return REJECTED, "its correlation does not match the open wait"
    if wait.sources and signal.source not in wait.sources:
        return REJECTED, f"source {signal.source!r} may not resume this wait"
    if wait.request_hash is not None and signal.request_hash != wait.request_hash:
        return REJECTED, "it approves another request than the one awaiting approval"
    return ACCEPTED, None


def _earlier_visit(correlation: str | None, current: str) -> bool:
    """True if ``correlation`` is a token this instance issued for an earlier wait."""
    if not correlation:
        return False
    prefix, _, seq = correlation.rpartition(":")
    current_prefix, _, current_seq = current.rpartition(":")
    workflow = prefix.rpartition(":")[0]
    current_workflow = current_prefix.rpartition(":")[0]
    return (
        workflow == current_workflow
        and seq.isdigit()
        and current_seq.isdigit()
        and int(seq) < int(current_seq)
    )
