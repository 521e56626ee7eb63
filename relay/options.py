"""Tuning knobs of the relay, with defaults suited to production."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from outboxkit.outbox.backoff import Backoff
from outboxkit.relay.slot import check_slot_name


@dataclass(frozen=True)
class RelayOptions:
    """How the relay claims, publishes, retries and cleans up. Durations are in seconds.

    ``lease_ttl_s`` bounds how long a dead relay's shards wait for another relay; it must be
    at least twice ``request_timeout_s`` so a batch in flight rarely outlives its lease
    (when it does, the next owner publishes those rows again: duplicates, never a loss).
    ``retention_s`` of 0 deletes rows once published; otherwise they are kept (and deduplicate
    ``(source, id)``) for that long and deleted in chunks of ``cleanup_chunk``.
    ``request_timeout_s`` and ``linger_s`` are the Kafka producer's ``request_timeout_ms`` and
    ``linger_ms``, in seconds.

    ``mode``: ``"poll"`` claims rows from the table (any database); ``"logical"`` (PostgreSQL
    with ``wal_level=logical``) reads committed inserts from the replication slot
    ``slot_name`` (default ``outboxkit_<database>``), one active relay per slot, and deletes
    rows once published (``retention_s`` does not apply); see docs/relay.md#logical-mode.
    ``logical_reader``: ``"stream"`` (default) keeps one replication-protocol session open
    (psycopg2, in a thread); ``"sql"`` peeks with ``pg_logical_slot_peek_binary_changes`` on
    the relay's engine (a new decoding session per read: slower, no second driver).

    ``stall_after_s``: rows due that long on the relay's shards while it published nothing
    for as long make it stalled (a log line, ``/readyz`` 503, ``outboxkit_relay_stalled``);
    ``max_slot_lag_bytes`` (logical mode, ``None``: no limit) does the same for its slot's
    lag (docs/observability.md#stalls).
    ``statement_timeout_s`` bounds each statement on the engine the relay makes from its URL
    (asyncpg's ``command_timeout``; an engine given to the relay is used as it is): a server
    that stops answering (hung, or cut off without a reset) is an outage after that long,
    retried with backoff on a new connection, never a relay stuck for ever.
    """

    batch_size: int = 500
    lease_ttl_s: float = 30.0
    poll_interval_s: float = 1.0
    max_attempts: int = 10
    row_backoff: Backoff = field(default_factory=lambda: Backoff(base_s=1.0, cap_s=300.0))
    outage_backoff: Backoff = field(
        default_factory=lambda: Backoff(base_s=0.2, cap_s=10.0, floor_s=0.05)
    )
    retention_s: float = 7 * 24 * 3600.0
    cleanup_interval_s: float = 60.0
    cleanup_chunk: int = 5000
    request_timeout_s: float = 10.0
    # 0: a claimed batch is handed to the producer in one go (send() does not yield between
    # rows), so it is batched anyway; waiting longer only adds latency.
    linger_s: float = 0.0
    max_batch_bytes: int = 512 * 1024
    max_request_size: int = 1024 * 1024
    listen: bool = True
    mode: Literal["poll", "logical"] = "poll"
    slot_name: str | None = None
    logical_reader: Literal["stream", "sql"] = "stream"
    stall_after_s: float = 60.0
    max_slot_lag_bytes: int | None = None
    statement_timeout_s: float = 60.0

    def __post_init__(self) -> None:
        if self.mode not in ("poll", "logical"):
            raise ValueError(f"mode must be 'poll' or 'logical', not {self.mode!r}")
        if self.logical_reader not in ("stream", "sql"):
            raise ValueError(
                f"logical_reader must be 'stream' or 'sql', not {self.logical_reader!r}"
            )
        if self.slot_name is not None:
            check_slot_name(self.slot_name)
        if self.batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        if self.request_timeout_s <= 0:
            raise ValueError("request_timeout_s must be positive")
        if self.linger_s < 0:
            raise ValueError("linger_s must not be negative")
        if self.lease_ttl_s < 2 * self.request_timeout_s:
            raise ValueError("lease_ttl_s must be at least twice the Kafka request timeout")
        if self.statement_timeout_s <= 0:
            raise ValueError("statement_timeout_s must be positive")
        if self.poll_interval_s <= 0:
            raise ValueError("poll_interval_s must be positive")
        if self.stall_after_s < self.poll_interval_s:
            # without LISTEN a row waits up to a poll interval for a relay that is well
            raise ValueError("stall_after_s must not be shorter than poll_interval_s")
        if self.max_slot_lag_bytes is not None and self.max_slot_lag_bytes < 0:
            raise ValueError("max_slot_lag_bytes must not be negative")
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if self.retention_s < 0:
            raise ValueError("retention_s must not be negative")
        if self.cleanup_interval_s <= 0 or self.cleanup_chunk < 1:
            raise ValueError("cleanup_interval_s must be positive and cleanup_chunk at least 1")
