"""Redactions the leak hunt can remove, one by one, to prove it sees each of them.

Each point names a redaction of outboxkit and how to remove it (the module attribute, and
what replaces it). The hunt applies the chosen points in its own process (``monkeypatch``) and,
through ``LEAK_SABOTAGE`` (comma separated), in the processes it runs (``traced_cli`` and the
HTTP app call :func:`apply_from_environment` first).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from typing import Any

Setter = Callable[[Any, str, Any], None]


def _identity(original: Any) -> Any:
    return lambda value, *args, **kwargs: value


def _message(original: Any) -> Any:
    return lambda error, *args, **kwargs: f"{type(error).__name__}: {error}"


def _no_extra_keys(original: Any) -> Any:
    return lambda value, extra: original(value, frozenset())


def _never_secret(original: Any) -> Any:
    return lambda name, *args, **kwargs: False


def _password_shown(original: Any) -> Any:
    return lambda url, hide_password=True: original(url, hide_password=False)


def _unmasked(original: Any) -> Any:
    return lambda error, secrets=(), replace=None: original(error, (), replace)


def _without_private_key(original: Any) -> Any:
    return tuple(word for word in original if word != "privatekey")


Removal = tuple[str, str, Callable[[Any], Any]]
POINTS: dict[str, list[Removal]] = {
    "history redact": [("outboxkit.workflows.changes", "redact", _identity)],
    "signal data redact": [("outboxkit.workflows.engine", "redact", _identity)],
    "workflows show redact": [("outboxkit.ops.workflows", "redact", _identity)],
    "dlq show redact": [("outboxkit.ops.dlq.rendering", "redact", _identity)],
    "dlq show header redact": [("outboxkit.ops.dlq.rendering", "is_secret_key", _never_secret)],
    "actions show redact": [("outboxkit.ops.actions", "redact", _identity)],
    "redact_keys": [("outboxkit.outbox.secrecy", "_redact", _no_extra_keys)],
    "secret word privatekey": [("outboxkit.outbox.secrecy", "SECRET_WORDS", _without_private_key)],
    "dead-letter describe_error": [("outboxkit.consumers.dlq", "describe_error", _message)],
    "actions describe_error": [("outboxkit.actions.runner", "describe_error", _message)],
    "workflow describe_error": [("outboxkit.workflows.decisions", "describe_error", _message)],
    "describe_error": [("outboxkit.outbox.secrecy", "_describe", _message)],
    "database URL password": [  # two layers: the URL printed hidden, the password masked
        ("sqlalchemy.engine.url:URL", "render_as_string", _password_shown),
        ("outboxkit.ops.status", "cause_line", _unmasked),
    ],
}
"""Each redaction point: its removals, each (module or ``module:Class``, attribute, the
replacement built from the original)."""


def apply(names: list[str], setter: Setter = setattr) -> None:
    """Remove the redactions ``names`` (keys of :data:`POINTS`) with ``setter``."""
    for where, attribute, replace in (removal for name in names for removal in POINTS[name]):
        module_name, _, class_name = where.partition(":")
        owner = importlib.import_module(module_name)
        if class_name:
            owner = getattr(owner, class_name)
        setter(owner, attribute, replace(getattr(owner, attribute)))


def apply_from_environment() -> None:
    """Remove the redactions named in ``LEAK_SABOTAGE`` (none when it is unset)."""
    names = [name for name in os.environ.get("LEAK_SABOTAGE", "").split(",") if name]
    apply(names)
