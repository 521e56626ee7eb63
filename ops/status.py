"""One picture of the pipeline for operators and alerts: outbox backlog, relays and their shard
leases, UNKNOWN agent actions, inbox size, consumer lag, dead letters; and which alert
thresholds it crosses.

Each section reports what its own source says. The database gives the outbox, relays, shards,
actions and inbox sections; the broker gives consumer lag and dead letters. A source that
cannot be read marks its sections :class:`Unreachable` (one line, never a secret) and the other
sections are read as usual, so the report tells the most exactly when something is broken.

Database facts and ages use the database clock; Kafka facts are offsets read when the report
is made, and the age of a dead letter is measured on this machine's clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from aiokafka import TopicPartition
from outboxkit.actions.states import State
from outboxkit.actions.tables import agent_operations
from outboxkit.consumers.offsets import committed_ms
from outboxkit.consumers.tables import inbox_events
from outboxkit.ops.access import (
    DEFAULT_TIMEOUT_S,
    DatabaseUnreachableError,
    OpsError,
    database_bounded,
    kafka_bounded,
    ops_engine,
    require_tables,
)
from outboxkit.ops.dlq.discard import discarded_count
from outboxkit.ops.dlq.reader import DlqReader
from outboxkit.ops.dlq.sequences import summarize as summarize_sequences
from outboxkit.ops.dlq.tables import dlq_discards, dlq_replays, held_by
from outboxkit.outbox.db import parse_url
from outboxkit.outbox.kafka_settings import KafkaSettings
from outboxkit.outbox.sharding import SHARD_COUNT
from outboxkit.outbox.tables import outbox_events, outbox_relays, outbox_shard_leases
from outboxkit.relay.failover import Gap, open_gaps
from outboxkit.relay.outbox_counts import COUNT_CAP, oldest_due_in, read_counts
from outboxkit.relay.slot import SlotLag, slot_lags
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

DLQ_SUFFIX = ".dlq"
TABLES = (
    outbox_events.name,
    outbox_relays.name,
    outbox_shard_leases.name,
    inbox_events.name,
    dlq_replays.name,
    dlq_discards.name,
    agent_operations.name,
)
OK = "ok"
UNREACHABLE = "unreachable"
PARTIAL = "partial"
MAX_CAUSE_CHARS = 300
DEFAULT_MAX_STALL_S = 60.0
DEFAULT_MAX_SLOT_INACTIVE_S = 300.0
DEFAULT_MAX_GROUP_STALL_S = 300.0


# Lagging partitions whose next record's age is read, per group and report.
MAX_STALL_READS = 16

GROUPS_NEED_DATABASE = (
    "the groups are the inbox's consumer names and the database is unreachable: "
    "name them with --group"
)


@dataclass(frozen=True)
class Unreachable:
    """A source, or a part of one, that could not be read; ``cause`` is one line, no secret."""

    cause: str


@dataclass
class RelayInfo:
    """A relay and the shards it holds a live lease on; ``quiet_s``: how long it has published
    nothing (as of its last heartbeat's record: since its last publish, or its start), and
    ``oldest_due_age_s``: how long the oldest due row on its shards has waited."""

    relay_id: str
    host: str | None
    pid: int | None
    heartbeat_age_s: float | None
    shards: list[int]
    quiet_s: float | None = None
    oldest_due_age_s: float | None = None


@dataclass
class OutboxInfo:
    """Unpublished rows: ``backlog`` due and pending, ``parked`` set aside after failures,
    ``scheduled`` for later (not backlog until due). The backlog's oldest row is the one due
    the longest (a scheduled row counts from its due time, others from their creation).
    Parked and scheduled rows are counted up to a cap (:mod:`outboxkit.relay.outbox_counts`):
    ``parked_at_least`` / ``scheduled_at_least`` say the count reached it, there may be more."""

    backlog: int
    oldest_created_ms: int | None
    oldest_age_s: float | None
    parked: int
    scheduled: int = 0
    next_due_ms: int | None = None
    next_due_in_s: float | None = None
    parked_at_least: bool = False
    scheduled_at_least: bool = False

    @property
    def parked_text(self) -> str:
        """``parked`` for people: ``≥ 10000`` when the count reached its cap."""
        return f"≥ {self.parked}" if self.parked_at_least else str(self.parked)

    @property
    def scheduled_text(self) -> str:
        """``scheduled`` for people, as :attr:`parked_text`."""
        return f"≥ {self.scheduled}" if self.scheduled_at_least else str(self.scheduled)


@dataclass
class ActionsInfo:
    """Agent actions whose outcome is UNKNOWN, and the one that has been UNKNOWN the longest."""

    unknown: int
    needs_attention: int
    oldest_unknown_ms: int | None
    oldest_unknown_age_s: float | None


@dataclass
class InboxInfo:
    """Rows of the inbox, per consumer, and how long ago each consumer last applied an event."""

    rows: int
    by_consumer: dict[str, int]
    last_processed_age_s: dict[str, float]


@dataclass
class SequencesInfo:
    """Keys held behind a dead-lettered head (``on_dead_letter="sequence"``), and the oldest."""

    blocked_keys: int = 0
    held: int = 0
    oldest_blocked_ms: int | None = None
    oldest_blocked_age_s: float | None = None


@dataclass
class DatabaseStatus:
    """What the database says: outbox, relays, shard leases, actions, inbox."""

    now_ms: int
    outbox: OutboxInfo
    relays: list[RelayInfo]
    free_shards: int
    actions: ActionsInfo
    inbox: InboxInfo
    slots: list[SlotLag] = field(default_factory=list)
    sequences: SequencesInfo = field(default_factory=SequencesInfo)
    # WAL-message gaps not yet acknowledged (relay/failover.py): each one crosses.
    gaps: list[Gap] = field(default_factory=list)
    unheld_oldest_age_s: float | None = None
    """How long the oldest due row on shards no relay holds a live lease on has waited."""


@dataclass
class PartitionLag:
    """A group's position in one partition; ``committed`` is ``None`` when it has none."""

    topic: str
    partition: int
    committed: int | None
    end: int
    lag: int
    committed_age_s: float | None = None
    """Age of the last commit (outboxkit consumers stamp it), read for lagging partitions."""
    waiting_age_s: float | None = None
    """Age of the next record to handle, read for lagging partitions whose last commit (or
    none) is older than ``--max-group-stall``."""


@dataclass
class GroupLag:
    """A consumer group's lag over the partitions of the topics it has committed offsets for."""

    group: str
    total_lag: int
    partitions: list[PartitionLag] = field(default_factory=list)


@dataclass
class DlqInfo:
    """A dead-letter topic: its letters still to handle (``records``: those held minus the
    discarded ones), how many of those held were ``discarded`` and ``replayed`` (both ``None``
    when the database is unreachable: ``records`` is then every letter held), and the oldest
    record still held. ``held`` is every record in the topic (end minus beginning offsets)."""

    topic: str
    records: int
    replayed: int | None
    partitions: dict[int, int]
    held: int = 0
    discarded: int | None = None
    oldest_timestamp_ms: int | None = None
    oldest_age_s: float | None = None
    bounds: dict[int, tuple[int, int]] = field(default_factory=dict, repr=False)
    """``{partition: (first offset, end offset)}``, for the replay ledger; not in the JSON."""


@dataclass(frozen=True)
class DlqTopicUnreachable:
    """A dead-letter topic that could not be read (it does not exist, or the broker failed)."""

    topic: str
    cause: str


@dataclass
class Thresholds:
    """Alert limits; ``None`` checks nothing. A value above its limit crosses it. The three
    stall checks are on by default (docs/observability.md#stalls)."""

    max_oldest_age_s: float | None = None
    max_dlq: int | None = None
    max_parked: int | None = None
    max_lag: int | None = None
    max_slot_lag_bytes: int | None = None
    max_slot_age_s: float | None = None
    max_stall_s: float | None = DEFAULT_MAX_STALL_S
    max_slot_inactive_s: float | None = DEFAULT_MAX_SLOT_INACTIVE_S
    max_group_stall_s: float | None = DEFAULT_MAX_GROUP_STALL_S


Consumers = list[GroupLag] | Unreachable
DeadLetters = list[DlqInfo | DlqTopicUnreachable] | Unreachable


@dataclass
class StatusReport:
    """The whole picture by source, and the thresholds it crosses."""

    time_ms: int
    database: DatabaseStatus | Unreachable
    kafka: Unreachable | None
    consumers: Consumers
    dlq: DeadLetters
    crossed: list[str] = field(default_factory=list)

    def unreachable(self) -> list[str]:
        """One line per source or part that could not be read (each cause once)."""
        lines: list[str] = []
        # The causes of the database and the broker name them already.
        parts: list[tuple[str, Unreachable | DlqTopicUnreachable | None]] = [
            ("", self.database if isinstance(self.database, Unreachable) else None),
            ("", self.kafka),
            ("consumer lag", self._consumers_unreachable()),
            ("dead letters", self.dlq if isinstance(self.dlq, Unreachable) else None),
        ]
        if not isinstance(self.dlq, Unreachable):
            parts += [
                (f"dead-letter topic {info.topic}", info)
                for info in self.dlq
                if isinstance(info, DlqTopicUnreachable)
            ]
        seen: set[str] = set()
        for name, part in parts:
            if part is not None and part.cause not in seen:
                seen.add(part.cause)
                lines.append(f"{name}: {part.cause}" if name else part.cause)
        return lines

    def _consumers_unreachable(self) -> Unreachable | None:
        # Lag unread only because the database (its groups' names) is: that source is named.
        if not isinstance(self.consumers, Unreachable):
            return None
        if self.consumers.cause == GROUPS_NEED_DATABASE and isinstance(self.database, Unreachable):
            return None
        return self.consumers

    def to_json(self) -> dict[str, Any]:
        """JSON-ready values; every section has a ``status`` (``ok``, ``unreachable`` with a
        ``cause``, or ``partial`` for dead letters some of whose topics could not be read)."""
        db = self.database
        report: dict[str, Any] = {"time_ms": self.time_ms}
        report["sources"] = {
            "database": _state(db if isinstance(db, Unreachable) else None),
            "kafka": _state(self.kafka),
        }
        if isinstance(db, Unreachable):
            sections = ("outbox", "relays", "shards", "actions", "inbox", "slots", "sequences")
            for name in (*sections, "gaps"):
                report[name] = _state(db)
        else:
            report["outbox"] = {**_state(None), **asdict(db.outbox)}
            report["relays"] = {
                **_state(None),
                "items": [
                    {**asdict(relay), "shard_count": len(relay.shards)} for relay in db.relays
                ],
            }
            report["shards"] = {
                **_state(None),
                "total": SHARD_COUNT,
                "held": SHARD_COUNT - db.free_shards,
                "free": db.free_shards,
                "unheld_oldest_age_s": db.unheld_oldest_age_s,
            }
            report["actions"] = {**_state(None), **asdict(db.actions)}
            report["inbox"] = {**_state(None), **asdict(db.inbox)}
            report["slots"] = {**_state(None), "items": [asdict(slot) for slot in db.slots]}
            report["sequences"] = {**_state(None), **asdict(db.sequences)}
            report["gaps"] = {**_state(None), "items": [asdict(gap) for gap in db.gaps]}
        if isinstance(self.consumers, Unreachable):
            report["consumers"] = _state(self.consumers)
        else:
            report["consumers"] = {
                **_state(None),
                "groups": [asdict(group) for group in self.consumers],
            }
        report["dlq"] = _dlq_json(self.dlq)
        report["crossed"] = self.crossed
        report["unreachable"] = self.unreachable()
        return report


def _state(part: Unreachable | DlqTopicUnreachable | None) -> dict[str, Any]:
    if part is None:
        return {"status": OK}
    return {"status": UNREACHABLE, "cause": part.cause}


def _dlq_json(dlq: DeadLetters) -> dict[str, Any]:
    if isinstance(dlq, Unreachable):
        return _state(dlq)
    topics: list[dict[str, Any]] = []
    for info in dlq:
        if isinstance(info, DlqTopicUnreachable):
            topics.append({"topic": info.topic, **_state(info)})
        else:
            partitions = {str(p): n for p, n in info.partitions.items()}
            values = asdict(info)
            del values["bounds"]
            topics.append({**_state(None), **values, "partitions": partitions})
    partial = any(isinstance(info, DlqTopicUnreachable) for info in dlq)
    return {"status": PARTIAL if partial else OK, "topics": topics}


def cause_line(
    error: BaseException, secrets: Iterable[str] = (), replace: tuple[str, str] | None = None
) -> str:
    """``error`` as one line for an operator: whitespace folded, ``replace`` applied (e.g. the
    driver's URL by the operator's), each secret masked where it stands as a word, capped."""
    text = " ".join(str(error).split()) or type(error).__name__
    if replace is not None:
        text = text.replace(*replace)
    for secret in secrets:
        if secret:
            # as a word only: a password "postgres" must not turn "postgresql://" into "***ql://"
            text = re.sub(rf"(?<![\w]){re.escape(secret)}(?![\w])", "***", text)
    if len(text) > MAX_CAUSE_CHARS:
        text = text[: MAX_CAUSE_CHARS - 1] + "…"
    return text


async def read_status(
    db_url: str,
    kafka_settings: KafkaSettings,
    *,
    groups: Sequence[str] = (),
    dlq_topics: Sequence[str] = (),
    timeout: float = DEFAULT_TIMEOUT_S,
    limits: Thresholds | None = None,
) -> StatusReport:
    """Connect to every source, read it with :func:`report_status`, disconnect (``outboxkit
    status``: one report a run). A malformed ``db_url`` is the caller's error and raises; an
    unreachable database or broker does not.
    """
    engine: AsyncEngine | Unreachable
    try:
        engine = ops_engine(db_url, timeout)
    except DatabaseUnreachableError as error:  # a SQLite file that does not exist
        engine = Unreachable(cause_line(error, _secrets(db_url)))
    kafka = await connect_kafka(kafka_settings, timeout)
    try:
        return await report_status(
            engine,
            kafka,
            db_url=db_url,
            groups=groups,
            dlq_topics=dlq_topics,
            timeout=timeout,
            limits=limits,
        )
    finally:
        if isinstance(kafka, DlqReader):
            await kafka.close()
        if isinstance(engine, AsyncEngine):
            await engine.dispose()


async def connect_kafka(kafka: KafkaSettings, timeout: float) -> DlqReader | Unreachable:
    """A started reader (its admin client and consumer) for :func:`report_status`, or why the
    broker could not be reached (one line)."""
    reader = DlqReader(kafka, timeout)
    try:
        await reader.__aenter__()
    except OpsError as error:
        return Unreachable(cause_line(error))
    return reader


async def report_status(
    engine: AsyncEngine | Unreachable,
    kafka: DlqReader | Unreachable,
    *,
    db_url: str,
    groups: Sequence[str] = (),
    dlq_topics: Sequence[str] = (),
    timeout: float = DEFAULT_TIMEOUT_S,
    limits: Thresholds | None = None,
) -> StatusReport:
    """Read every source through clients the caller keeps (the console keeps them for its
    life, :func:`read_status` for one report), each read bounded by ``timeout``; a source that
    cannot be read marks its sections. ``kafka`` is a started reader (:func:`connect_kafka`) or
    why there is none; a broker that stops answering makes the report's ``kafka`` an
    :class:`Unreachable`, which tells a caller keeping the reader to connect again.

    Groups default to the inbox's consumer names (which need the database). ``db_url`` is the
    URL as the operator gave it, for the causes (its password is masked).
    """
    secrets = _secrets(db_url)
    time_ms = int(time.time() * 1000)
    # Counted far enough to tell whether --max-parked is crossed.
    max_parked = (limits or Thresholds()).max_parked
    count_cap = max(COUNT_CAP, max_parked + 1 if max_parked is not None else 0)
    shown_url = parse_url(db_url).render_as_string(True)
    database_task = asyncio.create_task(
        _read_database(engine, timeout, secrets, shown_url, count_cap)
    )
    try:

        async def group_names() -> list[str] | Unreachable:
            if groups:
                return sorted(set(groups))
            database = await database_task
            if isinstance(database, Unreachable):
                return Unreachable(GROUPS_NEED_DATABASE)
            return list(database.inbox.by_consumer)

        broker, consumers, dlq = await _read_kafka(
            kafka, group_names, dlq_topics, (limits or Thresholds()).max_group_stall_s
        )
        database = await database_task
        if isinstance(engine, AsyncEngine) and not isinstance(database, Unreachable):
            await add_ledgers(engine, timeout, dlq)
    finally:
        if not database_task.done():
            database_task.cancel()
    report = StatusReport(time_ms, database, broker, consumers, dlq)
    report.crossed = crossed(report, limits or Thresholds())
    return report


def _secrets(db_url: str) -> list[str]:
    return [parse_url(db_url).password or ""]


async def _read_database(
    engine: AsyncEngine | Unreachable,
    timeout: float,
    secrets: Sequence[str],
    shown_url: str,
    count_cap: int,
) -> DatabaseStatus | Unreachable:
    if isinstance(engine, Unreachable):
        return engine
    try:
        async with database_bounded(engine, timeout), asyncio.timeout(timeout):
            await require_tables(engine, TABLES)
            return await database_status(engine, count_cap)
    except OpsError as error:
        # The URL as the operator gave it (password hidden), not the driver's spelling of it.
        engine_url = engine.url.render_as_string(hide_password=True)
        return Unreachable(cause_line(error, secrets, replace=(engine_url, shown_url)))


async def _read_kafka(
    reader: DlqReader | Unreachable,
    group_names: Callable[[], Awaitable[list[str] | Unreachable]],
    dlq_topics: Sequence[str],
    stall_after_s: float | None,
) -> tuple[Unreachable | None, Consumers, DeadLetters]:
    if isinstance(reader, Unreachable):
        return reader, reader, reader
    try:
        # The topics as they are now (a kept reader would remember old ones); a broker that
        # does not answer this is down for the whole report.
        await reader.topics(refresh=True)
    except OpsError as error:
        down = Unreachable(cause_line(error))
        return down, down, down
    dlq: DeadLetters
    try:
        dlq = await dlq_counts(reader, dlq_topics)
    except OpsError as error:
        dlq = Unreachable(cause_line(error))
    names = await group_names()
    consumers: Consumers
    if isinstance(names, Unreachable):
        consumers = names
    else:
        try:
            consumers = await group_lags(reader, names, stall_after_s)
        except OpsError as error:
            consumers = Unreachable(cause_line(error))
    return None, consumers, dlq


async def database_status(engine: AsyncEngine, count_cap: int = COUNT_CAP) -> DatabaseStatus:
    """Read the outbox, relay, lease, action and inbox facts in one connection; parked and
    scheduled rows are counted up to ``count_cap``."""
    ops = agent_operations.c
    async with engine.connect() as connection:
        counts = await read_counts(connection, count_cap)
        now_ms = counts.now_ms
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
        # updated_ms is the time of the last state change: when an UNKNOWN one became UNKNOWN.
        unknown, attention, oldest_unknown = (
            await connection.execute(
                select(
                    func.count(),
                    func.count().filter(ops.needs_attention.is_(True)),
                    func.min(ops.updated_ms),
                ).where(ops.state == State.UNKNOWN.value)
            )
        ).one()
        inbox_rows = list(
            await connection.execute(
                select(
                    inbox_events.c.consumer,
                    func.count().label("rows"),
                    func.max(inbox_events.c.processed_ms).label("last"),
                )
                .group_by(inbox_events.c.consumer)
                .order_by(inbox_events.c.consumer)
            )
        )
        slots = await slot_lags(connection)
        blocked = await summarize_sequences(connection)
        gaps = await open_gaps(connection)
        # The oldest due row each relay's shards hold, and the shards nobody holds.
        oldest_due = {
            relay_id: _age_s(*await oldest_due_in(connection, shards))
            for relay_id, shards in held.items()
        }
        unheld = set(range(SHARD_COUNT)).difference(*held.values())
        unheld_oldest = _age_s(*await oldest_due_in(connection, unheld))
    relay_infos = []
    for relay_id in sorted(set(relays) | set(held)):
        registered = relays.get(relay_id)  # None: a lease holder that is not registered
        quiet = None
        if registered is not None:
            quiet = _age_s(now_ms, registered.published_ms or registered.started_ms)
        relay_infos.append(
            RelayInfo(
                relay_id=relay_id,
                host=registered.host if registered else None,
                pid=registered.pid if registered else None,
                heartbeat_age_s=_age_s(now_ms, registered.heartbeat_ms) if registered else None,
                shards=held.get(relay_id, []),
                quiet_s=quiet,
                oldest_due_age_s=oldest_due.get(relay_id),
            )
        )
    return DatabaseStatus(
        now_ms=now_ms,
        outbox=OutboxInfo(
            backlog=counts.pending,
            oldest_created_ms=counts.oldest_due_ms,
            oldest_age_s=_age_s(now_ms, counts.oldest_due_ms),
            parked=counts.parked,
            scheduled=counts.scheduled,
            next_due_ms=counts.next_due_ms,
            next_due_in_s=_in_s(now_ms, counts.next_due_ms),
            parked_at_least=counts.parked_at_least,
            scheduled_at_least=counts.scheduled_at_least,
        ),
        relays=relay_infos,
        free_shards=SHARD_COUNT - sum(len(shards) for shards in held.values()),
        actions=ActionsInfo(
            unknown=int(unknown),
            needs_attention=int(attention or 0),
            oldest_unknown_ms=oldest_unknown,
            oldest_unknown_age_s=_age_s(now_ms, oldest_unknown),
        ),
        inbox=InboxInfo(
            rows=sum(int(row.rows) for row in inbox_rows),
            by_consumer={row.consumer: int(row.rows) for row in inbox_rows},
            last_processed_age_s={row.consumer: (now_ms - row.last) / 1000 for row in inbox_rows},
        ),
        slots=slots,
        gaps=gaps,
        sequences=SequencesInfo(
            blocked_keys=blocked.blocked_keys,
            held=blocked.held,
            oldest_blocked_ms=blocked.oldest_blocked_ms,
            oldest_blocked_age_s=_age_s(now_ms, blocked.oldest_blocked_ms),
        ),
        unheld_oldest_age_s=unheld_oldest,
    )


def _age_s(now_ms: int, then_ms: int | None) -> float | None:
    return None if then_ms is None else max(0, now_ms - then_ms) / 1000


def _in_s(now_ms: int, then_ms: int | None) -> float | None:
    return None if then_ms is None else (then_ms - now_ms) / 1000


async def group_lags(
    reader: DlqReader, groups: Sequence[str], stall_after_s: float | None = None
) -> list[GroupLag]:
    """Each group's committed offsets against the end offsets of its topics' partitions.

    A partition of those topics without a committed offset counts everything it holds as lag
    (a new member would start from the earliest record). For a lagging partition, the age of
    its last commit (stamped by outboxkit consumers); when that is older than
    ``stall_after_s`` (or unknown), the age of the next record to handle, read from Kafka
    (one fetch, for at most :data:`MAX_STALL_READS` partitions a group).
    """
    topics = await reader.topics()
    now_ms = int(time.time() * 1000)
    lags = []
    async with contextlib.AsyncExitStack() as stack:
        records = _RecordReader(reader, stack)
        for group in groups:
            lags.append(await _group_lag(reader, records, group, topics, now_ms, stall_after_s))
    return lags


class _RecordReader:
    """Reads single records on a reader of its own, opened at the first need: the caller's
    consumer may be shared (the console's), and reading a record moves it."""

    def __init__(self, reader: DlqReader, stack: contextlib.AsyncExitStack) -> None:
        self._kafka, self._timeout, self._stack = reader.kafka, reader.timeout, stack
        self._own: DlqReader | None = None

    async def age_s(self, tp: TopicPartition, offset: int, now_ms: int) -> float | None:
        """Age of the record at ``offset`` by its timestamp; ``None`` if it cannot be read."""
        try:
            if self._own is None:
                self._own = await self._stack.enter_async_context(
                    DlqReader(self._kafka, self._timeout)
                )
            record = await self._own.fetch(tp.topic, tp.partition, offset)
        except OpsError:
            return None
        return _age_s(now_ms, record.timestamp)


async def _group_lag(
    reader: DlqReader,
    records: _RecordReader,
    group: str,
    topics: dict[str, list[int]],
    now_ms: int,
    stall_after_s: float | None,
) -> GroupLag:
    """One group's :class:`GroupLag` (see :func:`group_lags`)."""
    async with kafka_bounded(reader.kafka, reader.timeout, f"offsets of group {group}"):
        committed = await reader.admin.list_consumer_group_offsets(group)
    positions = {tp: meta.offset for tp, meta in committed.items() if meta.offset >= 0}
    stamps = {tp: committed_ms(meta.metadata) for tp, meta in committed.items()}
    names = sorted({tp.topic for tp in positions if tp.topic in topics})
    tps = [TopicPartition(name, p) for name in names for p in topics[name]]
    lag = GroupLag(group, 0)
    if tps:
        async with kafka_bounded(reader.kafka, reader.timeout, f"end offsets ({group})"):
            begins = await reader.consumer.beginning_offsets(tps)
            ends = await reader.consumer.end_offsets(tps)
        reads = 0
        for tp in tps:
            position = positions.get(tp)
            start = position if position is not None else begins[tp]
            part = PartitionLag(
                tp.topic, tp.partition, position, ends[tp], max(0, ends[tp] - start)
            )
            lag.partitions.append(part)
            if part.lag == 0:
                continue
            part.committed_age_s = _age_s(now_ms, stamps.get(tp))
            old = part.committed_age_s is None or (
                stall_after_s is not None and part.committed_age_s > stall_after_s
            )
            if stall_after_s is not None and old and reads < MAX_STALL_READS:
                reads += 1
                part.waiting_age_s = await records.age_s(tp, start, now_ms)
        lag.total_lag = sum(p.lag for p in lag.partitions)
    return lag


async def dlq_counts(
    reader: DlqReader, topics: Sequence[str] | None
) -> list[DlqInfo | DlqTopicUnreachable]:
    """Records in each dead-letter topic (``topics``, or every topic ending in ``.dlq``) and
    the timestamp of the oldest one still held.

    A topic named in ``topics`` that does not exist, or whose offsets the broker does not
    give, is a :class:`DlqTopicUnreachable`; the others are read all the same. The cost is
    bounded: two offset requests and one time-index request per topic, no record is read.
    ``replayed`` and ``discarded`` are left ``None`` and ``records`` counts every letter held
    (the database's part: :func:`report_status` takes the discarded ones out).
    """
    existing = await reader.topics()
    if topics:
        chosen = sorted(set(topics))
    else:
        chosen = sorted(name for name in existing if name.endswith(DLQ_SUFFIX))
    now_ms = int(time.time() * 1000)
    infos: list[DlqInfo | DlqTopicUnreachable] = []
    for name in chosen:
        if name not in existing:
            infos.append(
                DlqTopicUnreachable(name, f"topic {name!r} does not exist on {reader.bootstrap}")
            )
            continue
        try:
            bounds = await reader.offsets(name, existing[name])
            firsts = await reader.first_timestamps(name, bounds)
        except OpsError as error:
            infos.append(DlqTopicUnreachable(name, cause_line(error)))
            continue
        oldest = min(firsts.values(), default=None)
        held = sum(end - first for first, end in bounds.values())
        infos.append(
            DlqInfo(
                topic=name,
                records=held,
                replayed=None,
                partitions={p: end - first for p, (first, end) in sorted(bounds.items())},
                held=held,
                oldest_timestamp_ms=oldest,
                oldest_age_s=_age_s(now_ms, oldest),
                bounds=bounds,
            )
        )
    return infos


async def add_ledgers(engine: AsyncEngine, timeout: float, dlq: DeadLetters) -> None:
    """Complete :func:`dlq_counts`' answer from the database: per topic, how many of the
    letters held are discarded (taken out of ``records``) and replayed; two indexed counts per
    topic in one connection. An unreachable database leaves them ``None``."""
    if isinstance(dlq, Unreachable):
        return
    infos = [info for info in dlq if isinstance(info, DlqInfo)]
    if not infos:
        return
    try:
        async with (
            database_bounded(engine, timeout),
            asyncio.timeout(timeout),
            engine.connect() as connection,
        ):
            for info in infos:
                discarded = await discarded_count(connection, info.topic, info.bounds)
                info.replayed = await _replayed(connection, info.topic, info.bounds)
                info.discarded, info.records = discarded, info.held - discarded
    except OpsError:
        return  # the database went away since it was read: replayed and discards stay unknown


async def _replayed(
    connection: AsyncConnection, topic: str, bounds: dict[int, tuple[int, int]]
) -> int:
    # Records still in the topic that the ledger says were replayed (to any target).
    replayed = (
        select(dlq_replays.c.dlq_partition, dlq_replays.c.dlq_offset)
        .where(held_by(dlq_replays, topic, bounds))
        .distinct()
        .subquery()
    )
    return int(await connection.scalar(select(func.count()).select_from(replayed)) or 0)


def _stall_lines(db: DatabaseStatus, most: float | None) -> list[str]:
    """Rows waiting longer than ``most`` on a relay that has published nothing for as long,
    or on shards no relay holds (a relay stopped, dead or never started)."""
    if most is None:
        return []
    lines = []
    for relay in db.relays:
        waited, quiet = relay.oldest_due_age_s, relay.quiet_s
        if waited is not None and quiet is not None and waited > most and quiet > most:
            lines.append(
                f"relay {relay.relay_id} is stalled: the oldest due row on its "
                f"{len(relay.shards)} shard(s) has waited {waited:.0f} s and it has published "
                f"nothing for {quiet:.0f} s (--max-stall {most:g})"
            )
    waited = db.unheld_oldest_age_s
    if waited is not None and waited > most:
        lines.append(
            f"outbox stalled: a row has been due for {waited:.0f} s on {db.free_shards} "
            f"shard(s) no live relay holds (--max-stall {most:g})"
        )
    return lines


def _slot_lines(slots: list[SlotLag], limits: Thresholds) -> list[str]:
    lines = []
    inactive_after = limits.max_slot_inactive_s
    for slot in slots:
        if slot.wal_status == "unreserved" and inactive_after is not None:
            lines.append(
                f"replication slot {slot.name} is about to be invalidated (wal_status "
                "unreserved: it keeps more WAL than max_slot_wal_keep_size)"
            )
        age = slot.oldest_unconfirmed_age_s
        idle = not slot.active and slot.wal_status != "lost"
        if idle and inactive_after is not None and age is not None and age > inactive_after:
            lines.append(
                f"replication slot {slot.name} is inactive (no session streams it) and its "
                f"oldest unconfirmed outbox insert is {age:.0f} s old "
                f"(--max-slot-inactive {inactive_after:g})"
            )
        if slot.wal_status == "lost" and (
            limits.max_slot_lag_bytes is not None
            or limits.max_slot_age_s is not None
            or inactive_after is not None
        ):
            # Its lag is unbounded: it crosses any slot threshold.
            lines.append(
                f"replication slot {slot.name} is invalidated (wal_status lost): the relay "
                "recreates it and publishes the table's rows; outbox WAL messages not yet "
                "published are lost"
            )
            continue
        most = limits.max_slot_lag_bytes
        if most is not None and slot.lag_bytes > most:
            lines.append(
                f"replication slot {slot.name} lags {slot.lag_bytes} bytes "
                f"(--max-slot-lag-bytes {most})"
            )
        age, oldest = slot.oldest_unconfirmed_age_s, limits.max_slot_age_s
        if oldest is not None and age is not None and age > oldest:
            lines.append(
                f"replication slot {slot.name}: oldest unconfirmed outbox insert is "
                f"{age:.0f} s old (--max-slot-age {oldest:g})"
            )
    return lines


def _group_stall_lines(groups: list[GroupLag], most: float) -> list[str]:
    """Partitions whose next record has waited longer than ``most`` while the group
    committed nothing there for as long (or never)."""
    lines = []
    for group in groups:
        stuck = [
            part
            for part in group.partitions
            if part.lag > 0
            and part.waiting_age_s is not None
            and part.waiting_age_s > most
            and (part.committed_age_s is None or part.committed_age_s > most)
        ]
        if stuck:
            worst = max(stuck, key=lambda part: part.waiting_age_s or 0.0)
            committed = (
                "never committed"
                if worst.committed_age_s is None
                else f"last committed {worst.committed_age_s:.0f} s ago"
            )
            lines.append(
                f"consumer group {group.group} is stalled on {len(stuck)} partition(s): "
                f"{worst.topic}[{worst.partition}] lags {worst.lag} record(s), the next one "
                f"written {worst.waiting_age_s:.0f} s ago, {committed} "
                f"(--max-group-stall {most:g})"
            )
    return lines


def crossed(report: StatusReport, limits: Thresholds) -> list[str]:
    """One line per threshold crossed (a value strictly above its limit), checked on the
    sections that could be read: an unreachable source crosses nothing here (see
    :meth:`StatusReport.unreachable`)."""
    lines = []
    if not isinstance(report.database, Unreachable):
        outbox = report.database.outbox
        age = outbox.oldest_age_s
        limit = limits.max_oldest_age_s
        if limit is not None and age is not None and age > limit:
            lines.append(
                f"oldest unpublished outbox row is {age:.0f} s old (--max-oldest-age {limit:g})"
            )
        if limits.max_parked is not None and outbox.parked > limits.max_parked:
            lines.append(
                f"{outbox.parked_text} parked outbox row(s) (--max-parked {limits.max_parked})"
            )
        lines += _stall_lines(report.database, limits.max_stall_s)
        lines += _slot_lines(report.database.slots, limits)
        # No threshold: events were lost, whatever their number (outboxkit outbox gaps).
        lines += [
            f"{gap.line()}; acknowledge with outboxkit outbox gaps --ack {gap.id}"
            for gap in report.database.gaps
        ]
    if limits.max_lag is not None and not isinstance(report.consumers, Unreachable):
        for group in report.consumers:
            if group.total_lag > limits.max_lag:
                lines.append(
                    f"consumer group {group.group} lags {group.total_lag} record(s) "
                    f"(--max-lag {limits.max_lag})"
                )
    if limits.max_group_stall_s is not None and not isinstance(report.consumers, Unreachable):
        lines += _group_stall_lines(report.consumers, limits.max_group_stall_s)
    if limits.max_dlq is not None and not isinstance(report.dlq, Unreachable):
        for info in report.dlq:
            if isinstance(info, DlqInfo) and info.records > limits.max_dlq:
                lines.append(
                    f"dead-letter topic {info.topic} holds {info.records} record(s) "
                    f"(--max-dlq {limits.max_dlq})"
                )
    return lines
