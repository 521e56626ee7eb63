"""as_json: dataclasses as JSON-ready dicts."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from enum import StrEnum

from outboxkit.outbox.jsonable import as_json


class Color(StrEnum):
    RED = "red"


@dataclass
class Inner:
    color: Color
    tags: frozenset[str]


@dataclass
class Outer:
    name: str
    secret: bytes
    inner: Inner
    counts: Counter[str] = field(default_factory=Counter)
    items: tuple[Inner, ...] = ()


def test_fields_in_order_renamed_omitted_and_extended() -> None:
    outer = Outer("a", b"\x00", Inner(Color.RED, frozenset({"y", "x"})), Counter(t=2), ())
    document = as_json(outer, rename={"name": "title"}, omit={"secret"}, extra={"n": 1})
    assert list(document) == ["title", "inner", "counts", "items", "n"]
    assert document == {
        "title": "a",
        "inner": {"color": "red", "tags": ["x", "y"]},
        "counts": {"t": 2},  # dataclasses.asdict would give {("t", 2): 1}
        "items": [],
        "n": 1,
    }
    json.dumps(document)  # JSON-ready indeed
