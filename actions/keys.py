"""Stable operation keys: one logical action, one key, however often it is retried."""

from __future__ import annotations

import hashlib
import json
import re

from outboxkit.actions.errors import InvalidActionInputError

KEY_PREFIX = "op_"
MAX_KEY_LENGTH = 128
MAX_TENANT_LENGTH = 64
_KEY = re.compile(r"^[\x21-\x7e]{1,128}$")  # visible ASCII: it travels as an HTTP header
_TENANT = re.compile(r"^[^/\x00-\x1f\x7f]+$")


def operation_key(
    tenant: str,
    workflow_run_id: str,
    step_id: str,
    action_type: str,
    target_id: str,
    action_version: str | int,
) -> str:
    """Return the key of one logical action, e.g. ``op_3f2a...`` (35 characters).

    The key depends only on what identifies the action: the tenant, the workflow run, the step
    in it, the action type, the target (e.g. a charge id) and the version of the action's
    definition. Never pass an attempt number, a timestamp or a random value: a retry must
    produce the same key. Empty or missing parts raise :class:`InvalidActionInputError`.

    Every part is a ``str``, except the version, which may also be a non-negative ``int``
    (``1`` and ``"1"`` name the same version). An ``int`` elsewhere is refused rather than
    turned into text: ``target_id=42`` and ``target_id="42"`` would otherwise silently be one
    key; convert ids yourself, deliberately.
    """
    parts = {
        "tenant": tenant,
        "workflow_run_id": workflow_run_id,
        "step_id": step_id,
        "action_type": action_type,
        "target_id": target_id,
        "action_version": action_version,
    }
    for name, value in parts.items():
        allowed: tuple[type, ...] = (str, int) if name == "action_version" else (str,)
        if isinstance(value, bool) or not isinstance(value, allowed):
            raise InvalidActionInputError(
                f"operation key part {name!r} must be a str"
                f"{' or an int' if name == 'action_version' else ''}, not {type(value).__name__}"
            )
        if isinstance(value, str) and not value.strip():
            raise InvalidActionInputError(f"operation key part {name!r} is empty")
        if isinstance(value, int) and value < 0:
            raise InvalidActionInputError(f"operation key part {name!r} is negative")
    check_tenant(tenant)
    # A JSON array of the parts has no delimiter ambiguity ("a:b"+"c" vs "a"+"b:c").
    material = json.dumps([str(parts[name]) for name in parts], separators=(",", ":"))
    return KEY_PREFIX + hashlib.sha256(material.encode("utf-8")).hexdigest()[:32]


def check_key(key: str) -> str:
    """Return ``key`` if it is usable as an operation key (1-128 visible ASCII characters)."""
    if not isinstance(key, str) or not _KEY.match(key):
        raise InvalidActionInputError(
            f"operation key must be 1-{MAX_KEY_LENGTH} visible ASCII characters, got {key!r}"
        )
    return key


def check_tenant(tenant: str) -> str:
    """Return ``tenant`` if it is non-empty, at most 64 characters, without ``/`` or controls.

    ``/`` is refused because the tenant leads the deterministic event ids
    (``tenant/key/...``), which must stay unambiguous.
    """
    if (
        not isinstance(tenant, str)
        or not tenant.strip()
        or len(tenant) > MAX_TENANT_LENGTH
        or not _TENANT.match(tenant)
    ):
        raise InvalidActionInputError(
            f"tenant must be 1-{MAX_TENANT_LENGTH} characters without '/' or control "
            f"characters, got {tenant!r}"
        )
    return tenant
