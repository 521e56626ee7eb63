"""Mapping of event keys to relay shards.

Every outbox row belongs to one of :data:`SHARD_COUNT` shards, derived from its Kafka key. A shard
is published by at most one relay at a time, which is what keeps per-key order with several
relays. The count is part of the stored data: changing it needs a migration of ``shard``.
"""

from __future__ import annotations

import zlib

SHARD_COUNT = 64


def shard_for(key: bytes | None, event_id: str) -> int:
    """Return the shard of a row: from its Kafka key, or from its id when it has no key."""
    material = key if key is not None else event_id.encode("utf-8")
    return zlib.crc32(material) % SHARD_COUNT
