"""Dataclasses as JSON-ready dicts, for ``--json`` output and audit details.

Built on :func:`dataclasses.fields` rather than :func:`dataclasses.asdict`: ``asdict`` deep-copies
every value and rebuilds mappings through their own type, which turns a
:class:`collections.Counter` into a count of ``(key, value)`` pairs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
from enum import Enum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from _typeshed import DataclassInstance


def as_json(
    instance: DataclassInstance,
    *,
    rename: Mapping[str, str] | None = None,
    omit: Collection[str] = (),
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The fields of ``instance`` as JSON-ready values, in field order.

    ``rename`` maps field names to the keys written instead; fields named in ``omit`` are left
    out (payloads, internals); ``extra`` keys come after the fields. Nested dataclasses become
    dicts, enums their value, mappings dicts, sets sorted lists and other sequences lists.
    """
    names = rename or {}
    document = {
        names.get(field.name, field.name): jsonable(getattr(instance, field.name))
        for field in dataclasses.fields(instance)
        if field.name not in omit
    }
    if extra:
        document.update({key: jsonable(value) for key, value in extra.items()})
    return document


def jsonable(value: Any) -> Any:
    """``value`` with dataclasses, enums, mappings and collections made JSON-ready."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return as_json(value)
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, Mapping):
        return {key: jsonable(item) for key, item in value.items()}
    if isinstance(value, set | frozenset):
        return [jsonable(item) for item in sorted(value)]
    if isinstance(value, list | tuple):
        return [jsonable(item) for item in value]
    return value
