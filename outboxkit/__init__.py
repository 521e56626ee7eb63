"""outboxkit: change your database and tell the world about it, with no event lost and no
effect applied twice.

The names a service needs are here; each subpackage has its own job (see the README's layout):
``outboxkit.outbox`` writes events, ``outboxkit.relay`` publishes them, ``outboxkit.consumers``
applies them once, ``outboxkit.actions`` runs an agent's side effects at most once,
``outboxkit.workflows`` runs durable state machines on all of them,
``outboxkit.ops`` and ``outboxkit.cli`` serve operators, ``outboxkit.testing`` serves test suites.

Names load on first use (PEP 562): importing a subpackage, such as ``outboxkit.cli`` whose
start-up installs signal handlers before anything heavy, does not import them all.
"""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

try:
    __version__: str = version("outboxkit")
    """The installed distribution's version (pyproject.toml's ``version``)."""
except PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"

if TYPE_CHECKING:
    from outboxkit.actions import ActionStore, State, operation_key, run_action
    from outboxkit.consumers import ConsumerApp, ConsumerRuntime, ConsumerStats, KafkaRecord
    from outboxkit.migrations import upgrade
    from outboxkit.outbox import (
        InvalidEventError,
        KafkaSettings,
        Outbox,
        OutboxError,
        OutcomeUnknownError,
        PermanentError,
        RetryPolicy,
        TransientError,
        new_event,
        new_event_id,
    )
    from outboxkit.relay import Relay, RelayOptions, RelayStats
    from outboxkit.workflows import Workflow, WorkflowEngine, WorkflowWorker

_HOMES = {
    "ActionStore": "outboxkit.actions",
    "ConsumerApp": "outboxkit.consumers",
    "ConsumerRuntime": "outboxkit.consumers",
    "ConsumerStats": "outboxkit.consumers",
    "InvalidEventError": "outboxkit.outbox",
    "KafkaRecord": "outboxkit.consumers",
    "KafkaSettings": "outboxkit.outbox",
    "Outbox": "outboxkit.outbox",
    "OutboxError": "outboxkit.outbox",
    "OutcomeUnknownError": "outboxkit.outbox",
    "PermanentError": "outboxkit.outbox",
    "Relay": "outboxkit.relay",
    "RelayOptions": "outboxkit.relay",
    "RelayStats": "outboxkit.relay",
    "RetryPolicy": "outboxkit.outbox",
    "State": "outboxkit.actions",
    "TransientError": "outboxkit.outbox",
    "new_event": "outboxkit.outbox",
    "new_event_id": "outboxkit.outbox",
    "operation_key": "outboxkit.actions",
    "run_action": "outboxkit.actions",
    "upgrade": "outboxkit.migrations",
    "Workflow": "outboxkit.workflows",
    "WorkflowEngine": "outboxkit.workflows",
    "WorkflowWorker": "outboxkit.workflows",
}

__all__ = [
    "ActionStore",
    "ConsumerApp",
    "ConsumerRuntime",
    "ConsumerStats",
    "InvalidEventError",
    "KafkaRecord",
    "KafkaSettings",
    "Outbox",
    "OutboxError",
    "OutcomeUnknownError",
    "PermanentError",
    "Relay",
    "RelayOptions",
    "RelayStats",
    "RetryPolicy",
    "State",
    "TransientError",
    "Workflow",
    "WorkflowEngine",
    "WorkflowWorker",
    "new_event",
    "new_event_id",
    "operation_key",
    "run_action",
    "upgrade",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'outboxkit' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
