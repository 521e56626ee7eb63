"""Which routes require an ``Idempotency-Key``: ``"POST /refunds"``, ``"POST /orders/{id}/pay"``,
``"PUT /files/*"`` (a prefix), or a predicate of method and path."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

RouteMatcher = Callable[[str, str], bool]
Routes = Iterable[str] | RouteMatcher


def route_matcher(routes: Routes | None) -> RouteMatcher:
    """A predicate ``(method, path) -> bool`` for ``routes`` (``None``: no route)."""
    if routes is None:
        return lambda _method, _path: False
    if callable(routes):
        return routes
    compiled = [_compile(spec) for spec in routes]

    def matches(method: str, path: str) -> bool:
        return any(m == method and pattern.fullmatch(path) for m, pattern in compiled)

    return matches


def _compile(spec: str) -> tuple[str, re.Pattern[str]]:
    method, _, template = spec.strip().partition(" ")
    template = template.strip()
    if not method or not template.startswith("/"):
        raise ValueError(f"a route is 'METHOD /path', not {spec!r}")
    prefix = template.endswith("/*")
    if prefix:
        template = template[:-2]
    pieces = re.split(r"(\{[^/{}]+\})", template)
    regex = "".join("[^/]+" if p.startswith("{") else re.escape(p) for p in pieces)
    return method.upper(), re.compile(regex + ("(?:/.*)?" if prefix else ""))
