"""The fingerprint of a request: what must be equal for a second use of a key to be a retry.

Method, path with query string, the SHA-256 of the body and the values of headers the
application chose. Not the ``Idempotency-Key`` header itself. Each part is kept as a hash, so
a 422 can say *which* part differed without storing or echoing what it contained.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from outboxkit.idempotency.keys import HEADER

PARTS = ("method", "path", "body", "headers")


@dataclass(frozen=True, slots=True)
class Fingerprint:
    """A request's fingerprint: ``digest`` over ``parts`` (each part a hash, the method as is)."""

    parts: dict[str, str]
    digest: str

    def to_json(self) -> str:
        """The parts as stored in ``fingerprint_parts``."""
        return json.dumps(self.parts, sort_keys=True, separators=(",", ":"))

    def differing(self, stored_parts_json: str) -> list[str]:
        """Names of the parts that differ from a stored fingerprint's, in a fixed order."""
        try:
            stored = json.loads(stored_parts_json)
        except ValueError:
            return list(PARTS)
        return [name for name in PARTS if stored.get(name) != self.parts.get(name)]


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def fingerprint(
    method: str,
    path: str,
    query: bytes,
    body: bytes,
    headers: Iterable[tuple[bytes, bytes]],
    chosen_headers: Sequence[str] = (),
) -> Fingerprint:
    """The fingerprint of one request; ``chosen_headers`` are names (any case) to include."""
    wanted = [name.lower() for name in chosen_headers if name.lower() != HEADER]
    values: dict[str, list[str]] = {name: [] for name in wanted}
    for raw_name, raw_value in headers:
        name = raw_name.decode("latin-1").lower()
        if name in values:
            values[name].append(raw_value.decode("latin-1"))
    target = path + ("?" + query.decode("latin-1") if query else "")
    parts = {
        "method": method.upper(),
        "path": _sha256(target.encode("utf-8", "surrogateescape")),
        "body": _sha256(body),
        "headers": _sha256(json.dumps([[n, values[n]] for n in sorted(values)]).encode()),
    }
    digest = _sha256(json.dumps(parts, sort_keys=True, separators=(",", ":")).encode())
    return Fingerprint(parts=parts, digest=digest)
