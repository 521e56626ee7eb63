"""Canonical JSON and the SHA-256 hash that tells a retry from a different request."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from outboxkit.actions.errors import InvalidActionInputError
from pydantic import BaseModel


def canonical_json(value: Any) -> str:
    """Serialise ``value`` canonically: sorted keys, no whitespace, UTF-8, NaN/Infinity refused.

    Pydantic models are dumped in JSON mode first. Only str keys are accepted, because
    ``json`` would silently turn ``{1: x}`` into ``{"1": x}`` and make two inputs collide.
    Note that ``1`` and ``1.0`` are different JSON texts and so different parameters.
    """
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    _check_keys(value)
    try:
        return json.dumps(
            value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        )
    except (TypeError, ValueError) as error:
        raise InvalidActionInputError(f"value is not canonical JSON: {error}") from error


def params_hash(params: Any) -> str:
    """Return the hex SHA-256 of :func:`canonical_json` of ``params``."""
    return hashlib.sha256(canonical_json(params).encode("utf-8")).hexdigest()


def _check_keys(value: Any) -> None:
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise InvalidActionInputError(
                    f"JSON object keys must be str, not {type(key).__name__} ({key!r})"
                )
            _check_keys(item)
    elif isinstance(value, list | tuple):
        for item in value:
            _check_keys(item)
