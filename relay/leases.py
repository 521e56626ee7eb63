"""Shard leases: which relay may publish which shards, so per-key order survives several relays.

Every relay heartbeats into ``outbox_relays`` and takes a fair share of the
:data:`~outboxkit.outbox.sharding.SHARD_COUNT` shards through conditional updates of
``outbox_shard_leases`` (holder, expiry on the database clock). A lease is renewed on every
heartbeat; a dead relay's leases expire after the TTL and are taken over. On SQLite the relay
takes all shards or none, so one relay publishes and a second one waits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from outboxkit.outbox.dialects import dialect_of
from outboxkit.outbox.sharding import SHARD_COUNT
from outboxkit.outbox.tables import outbox_relays, outbox_shard_leases
from sqlalchemy import and_, delete, func, or_, select, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine


@dataclass
class ShardLeases:
    """The shard leases of one relay process."""

    engine: AsyncEngine
    relay_id: str
    host: str
    pid: int
    ttl_ms: int
    owned: frozenset[int] = frozenset()
    take_all: bool = False

    @property
    def exclusive(self) -> bool:
        """One relay holds every shard: on SQLite (one writer at a time) and in logical mode
        (one reader per replication slot)."""
        return self.take_all or dialect_of(self.engine).single_writer

    async def heartbeat(self, published_ago_s: float | None = None) -> frozenset[int]:
        """Register as alive, renew held leases, release or take shards toward a fair share.

        ``published_ago_s``: how long ago this relay last had a row acknowledged (``None``:
        never), recorded as ``published_ms`` on the database clock for ``status``'s stall check.
        """
        now = dialect_of(self.engine).now_ms()
        beat: dict[str, Any] = {"heartbeat_ms": now}
        if published_ago_s is not None:
            beat["published_ms"] = now - round(published_ago_s * 1000)
        async with self.engine.begin() as conn:
            updated = await conn.execute(
                update(outbox_relays).where(outbox_relays.c.relay_id == self.relay_id).values(beat)
            )
            if updated.rowcount == 0:
                await conn.execute(
                    outbox_relays.insert().values(
                        relay_id=self.relay_id,
                        host=self.host[:255],
                        pid=self.pid,
                        started_ms=now,
                        **beat,
                    )
                )
            now_ms: int = (await conn.execute(select(now))).scalar_one()
            await conn.execute(
                delete(outbox_relays).where(
                    outbox_relays.c.heartbeat_ms < now_ms - 10 * self.ttl_ms
                )
            )
            live = await conn.scalar(
                select(func.count())
                .select_from(outbox_relays)
                .where(outbox_relays.c.heartbeat_ms >= now_ms - self.ttl_ms)
            )
            renewed = await conn.execute(
                update(outbox_shard_leases)
                .where(outbox_shard_leases.c.holder == self.relay_id)
                .values(expires_ms=now_ms + self.ttl_ms)
                .returning(outbox_shard_leases.c.shard)
            )
            owned = {row.shard for row in renewed}
            if self.exclusive:
                owned = await self._take_all(conn, owned, now_ms)
            else:
                fair = math.ceil(SHARD_COUNT / max(1, live or 1))
                if len(owned) > fair:
                    owned = await self._release(conn, owned, len(owned) - fair)
                elif len(owned) < fair:
                    owned |= await self._take(conn, fair - len(owned), now_ms)
        self.owned = frozenset(owned)
        return self.owned

    async def _take(self, conn: AsyncConnection, count: int, now_ms: int) -> set[int]:
        free = or_(
            outbox_shard_leases.c.holder.is_(None), outbox_shard_leases.c.expires_ms < now_ms
        )
        candidates = (
            await conn.execute(
                select(outbox_shard_leases.c.shard)
                .where(free)
                .order_by(outbox_shard_leases.c.shard)
                .limit(count)
                .with_for_update(skip_locked=True)
            )
        ).scalars()
        shards = list(candidates)
        if not shards:
            return set()
        taken = await conn.execute(
            update(outbox_shard_leases)
            .where(and_(outbox_shard_leases.c.shard.in_(shards), free))
            .values(holder=self.relay_id, expires_ms=now_ms + self.ttl_ms)
            .returning(outbox_shard_leases.c.shard)
        )
        return {row.shard for row in taken}

    async def _take_all(self, conn: AsyncConnection, owned: set[int], now_ms: int) -> set[int]:
        if len(owned) == SHARD_COUNT:
            return owned
        held_by_others = await conn.scalar(
            select(func.count())
            .select_from(outbox_shard_leases)
            .where(
                outbox_shard_leases.c.holder.is_not(None),
                outbox_shard_leases.c.holder != self.relay_id,
                outbox_shard_leases.c.expires_ms >= now_ms,
            )
        )
        if held_by_others:
            return owned
        await conn.execute(
            update(outbox_shard_leases).values(
                holder=self.relay_id, expires_ms=now_ms + self.ttl_ms
            )
        )
        return set(range(SHARD_COUNT))

    async def _release(self, conn: AsyncConnection, owned: set[int], count: int) -> set[int]:
        extra = sorted(owned)[-count:]
        await conn.execute(
            update(outbox_shard_leases)
            .where(
                outbox_shard_leases.c.holder == self.relay_id,
                outbox_shard_leases.c.shard.in_(extra),
            )
            .values(holder=None, expires_ms=0)
        )
        return owned - set(extra)

    async def release_all(self) -> None:
        """Give every shard back and deregister, so another relay takes over at once."""
        async with self.engine.begin() as conn:
            await conn.execute(
                update(outbox_shard_leases)
                .where(outbox_shard_leases.c.holder == self.relay_id)
                .values(holder=None, expires_ms=0)
            )
            await conn.execute(
                delete(outbox_relays).where(outbox_relays.c.relay_id == self.relay_id)
            )
        self.owned = frozenset()
