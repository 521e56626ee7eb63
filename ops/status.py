"""One picture of the pipeline for operators and alerts: outbox backlog, relays and their shard
leases, consumer lag, inbox size, dead letters; and which alert thresholds it crosses.

Database facts use the database clock; Kafka facts are offsets read when the report is made.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from aiokafka import TopicPartition
from outboxkit.consumers.tables import inbox_events
from outboxkit.ops.access import kafka_bounded
from outboxkit.ops.dlq.reader import DlqReader, UnknownTopicError
from outboxkit.ops.dlq.tables import dlq_replays
from outboxkit.outbox.clock import db_now_ms
from outboxkit.outbox.sharding import SHARD_COUNT
from outboxkit.outbox.tables import outbox_events, outbox_relays, outbox_shard_leases
from sqlalchemy import func, or_, select
from sqlalchemy.ext.asyncio import AsyncEngine

DLQ_SUFFIX = ".dlq"
TABLES = (
    outbox_events.name,
    outbox_relays.name,
    outbox_shard_leases.name,
    inbox_events.name,
    dlq_replays.name,
)
_PENDING = outbox_events.c.published_ms.is_(None) & outbox_events.c.parked_ms.is_(None)


@dataclass
class RelayInfo:
    """A relay and the shards it holds a live lease on."""

    relay_id: str
    host: str | None
    pid: int | None
    heartbeat_age_s: float | None
    shards: list[int]


@dataclass
class OutboxInfo:
    """Unpublished rows: ``backlog`` pending, ``parked`` set aside after failures."""

    backlog: int
    oldest_created_ms: int | None
    oldest_age_s: float | None
    parked: int


@dataclass
class DatabaseStatus:
    """What the database says: outbox, relays, shard leases, inbox, replay ledger."""

    now_ms: int
    outbox: OutboxInfo
    relays: list[RelayInfo]
    free_shards: int
    inbox_rows: int
    inbox_by_consumer: dict[str, int]


@dataclass
class PartitionLag:
    """A group's position in one partition; ``committed`` is ``None`` when it has none."""

    topic: str
    partition: int
    committed: int | None
    end: int
    lag: int


@dataclass
class GroupLag:
    """A consumer group's lag over the partitions of the topics it has committed offsets for."""

    group: str
    total_lag: int
    partitions: list[PartitionLag] = field(default_factory=list)


@dataclass
class DlqInfo:
    """A dead-letter topic: records held (end minus beginning offsets), how many replayed."""

    topic: str
    records: int
    replayed: int
    partitions: dict[int, int]


@dataclass
class Thresholds:
    """Alert limits; ``None`` checks nothing. A value above its limit crosses it."""

    max_oldest_age_s: float | None = None
    max_dlq: int | None = None
    max_parked: int | None = None
    max_lag: int | None = None


@dataclass
class StatusReport:
    """The whole picture, and the thresholds it crosses."""

    database: DatabaseStatus
    consumers: list[GroupLag]
    dlq: list[DlqInfo]
    crossed: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """JSON-ready values."""
        db = self.database
        return {
            "time_ms": db.now_ms,
            "outbox": asdict(db.outbox),
            "relays": [{**asdict(relay), "shard_count": len(relay.shards)} for relay in db.relays],
            "shards": {
                "total": SHARD_COUNT,
                "held": SHARD_COUNT - db.free_shards,
                "free": db.free_shards,
            },
            "consumers": [asdict(group) for group in self.consumers],
            "inbox": {"rows": db.inbox_rows, "by_consumer": db.inbox_by_consumer},
            "dlq": [
                {**asdict(info), "partitions": {str(p): n for p, n in info.partitions.items()}}
                for info in self.dlq
            ],
            "crossed": self.crossed,
        }


async def database_status(engine: AsyncEngine) -> DatabaseStatus:
    """Read the outbox, relay, lease and inbox facts in one connection."""
    now = db_now_ms(engine.dialect.name)
    async with engine.connect() as connection:
        now_ms = int(await connection.scalar(select(now)))
        backlog, oldest = (
            await connection.execute(
                select(func.count(), func.min(outbox_events.c.created_ms)).where(_PENDING)
            )
        ).one()
        parked = await connection.scalar(
            select(func.count()).where(outbox_events.c.parked_ms.is_not(None))
        )
        relays = {row.relay_id: row for row in await connection.execute(select(outbox_relays))}
        held: dict[str, list[int]] = {}
        for row in await connection.execute(
            select(outbox_shard_leases.c.shard, outbox_shard_leases.c.holder)
            .where(
                outbox_shard_leases.c.holder.is_not(None),
                outbox_shard_leases.c.expires_ms > now_ms,
            )
            .order_by(outbox_shard_leases.c.shard)
        ):
            held.setdefault(row.holder, []).append(row.shard)
        inbox = {
            row.consumer: row.rows
            for row in await connection.execute(
                select(inbox_events.c.consumer, func.count().label("rows"))
                .group_by(inbox_events.c.consumer)
                .order_by(inbox_events.c.consumer)
            )
        }
    relay_infos = []
    for relay_id in sorted(set(relays) | set(held)):
        row = relays.get(relay_id)
        relay_infos.append(
            RelayInfo(
                relay_id=relay_id,
                host=row.host if row else None,
                pid=row.pid if row else None,
                heartbeat_age_s=(now_ms - row.heartbeat_ms) / 1000 if row else None,
                shards=held.get(relay_id, []),
            )
        )
    return DatabaseStatus(
        now_ms=now_ms,
        outbox=OutboxInfo(
            backlog=int(backlog),
            oldest_created_ms=oldest,
            oldest_age_s=(now_ms - oldest) / 1000 if oldest is not None else None,
            parked=int(parked or 0),
        ),
        relays=relay_infos,
        free_shards=SHARD_COUNT - sum(len(shards) for shards in held.values()),
        inbox_rows=sum(inbox.values()),
        inbox_by_consumer=inbox,
    )


async def group_lags(reader: DlqReader, groups: Sequence[str]) -> list[GroupLag]:
    """Each group's committed offsets against the end offsets of its topics' partitions.

    A partition of those topics without a committed offset counts everything it holds as lag
    (a new member would start from the earliest record).
    """
    topics = await reader.topics()
    lags = []
    for group in groups:
        async with kafka_bounded(reader.bootstrap, reader.timeout, f"offsets of group {group}"):
            committed = await reader.admin.list_consumer_group_offsets(group)
        positions = {tp: meta.offset for tp, meta in committed.items() if meta.offset >= 0}
        names = sorted({tp.topic for tp in positions if tp.topic in topics})
        tps = [TopicPartition(name, p) for name in names for p in topics[name]]
        lag = GroupLag(group, 0)
        if tps:
            async with kafka_bounded(reader.bootstrap, reader.timeout, f"end offsets ({group})"):
                begins = await reader.consumer.beginning_offsets(tps)
                ends = await reader.consumer.end_offsets(tps)
            for tp in tps:
                position = positions.get(tp)
                behind = ends[tp] - (position if position is not None else begins[tp])
                lag.partitions.append(
                    PartitionLag(tp.topic, tp.partition, position, ends[tp], max(0, behind))
                )
            lag.total_lag = sum(p.lag for p in lag.partitions)
        lags.append(lag)
    return lags


async def dlq_counts(
    reader: DlqReader, engine: AsyncEngine, topics: Sequence[str] | None
) -> list[DlqInfo]:
    """Records in each dead-letter topic (``topics``, or every topic ending in ``.dlq``)."""
    existing = await reader.topics()
    if topics:
        for name in topics:
            if name not in existing:
                raise UnknownTopicError(f"topic {name!r} does not exist on {reader.bootstrap}")
        chosen = sorted(set(topics))
    else:
        chosen = sorted(name for name in existing if name.endswith(DLQ_SUFFIX))
    infos = []
    for name in chosen:
        bounds = await reader.offsets(name, existing[name])
        replayed = await _replayed(engine, name, bounds)
        infos.append(
            DlqInfo(
                topic=name,
                records=sum(end - first for first, end in bounds.values()),
                replayed=replayed,
                partitions={p: end - first for p, (first, end) in sorted(bounds.items())},
            )
        )
    return infos


async def _replayed(engine: AsyncEngine, topic: str, bounds: dict[int, tuple[int, int]]) -> int:
    # Records still in the topic that the ledger says were replayed (to any target).
    held = [
        (dlq_replays.c.dlq_partition == p)
        & (dlq_replays.c.dlq_offset >= first)
        & (dlq_replays.c.dlq_offset < end)
        for p, (first, end) in bounds.items()
        if end > first
    ]
    if not held:
        return 0
    replayed = (
        select(dlq_replays.c.dlq_partition, dlq_replays.c.dlq_offset)
        .where(dlq_replays.c.dlq_topic == topic, or_(*held))
        .distinct()
        .subquery()
    )
    async with engine.connect() as connection:
        return int(await connection.scalar(select(func.count()).select_from(replayed)) or 0)


def crossed(report: StatusReport, limits: Thresholds) -> list[str]:
    """One line per threshold crossed (a value strictly above its limit)."""
    lines = []
    outbox = report.database.outbox
    age = outbox.oldest_age_s
    if limits.max_oldest_age_s is not None and age is not None and age > limits.max_oldest_age_s:
        lines.append(
            f"oldest unpublished outbox row is {age:.0f} s old "
            f"(--max-oldest-age {limits.max_oldest_age_s:g})"
        )
    if limits.max_parked is not None and outbox.parked > limits.max_parked:
        lines.append(f"{outbox.parked} parked outbox row(s) (--max-parked {limits.max_parked})")
    if limits.max_lag is not None:
        for group in report.consumers:
            if group.total_lag > limits.max_lag:
                lines.append(
                    f"consumer group {group.group} lags {group.total_lag} record(s) "
                    f"(--max-lag {limits.max_lag})"
                )
    if limits.max_dlq is not None:
        for info in report.dlq:
            if info.records > limits.max_dlq:
                lines.append(
                    f"dead-letter topic {info.topic} holds {info.records} record(s) "
                    f"(--max-dlq {limits.max_dlq})"
                )
    return lines
