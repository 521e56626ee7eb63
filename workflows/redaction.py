"""Keeping secrets out of the history and the published events."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

REDACTED = "[redacted]"
SENSITIVE_KEYS = re.compile(
    r"(secret|token|password|passwd|authorization|api[_-]?key|credential|cookie|signature|authsig)",
    re.IGNORECASE,
)


def redact(value: Any, extra_keys: Iterable[str] = ()) -> Any:
    """``value`` with the values of sensitive keys replaced by ``"[redacted]"``, recursively.

    Keys are sensitive when their name looks like a credential (``token``, ``api_key``,
    ``password``...) or is one of ``extra_keys`` (a definition's personal fields).
    """
    extra = {key.lower() for key in extra_keys}
    return _redact(value, extra)


def _redact(value: Any, extra: set[str]) -> Any:
    if isinstance(value, dict):
        return {
            key: REDACTED
            if isinstance(key, str) and (SENSITIVE_KEYS.search(key) or key.lower() in extra)
            else _redact(item, extra)
            for key, item in value.items()
        }
    if isinstance(value, list | tuple):
        return [_redact(item, extra) for item in value]
    return value
