"""Streaming a logical replication slot over the replication protocol, in a thread.

asyncpg and psycopg 3 have no replication-protocol client; psycopg2's
``LogicalReplicationConnection`` has one, and it blocks, so it runs in a dedicated thread.
The thread keeps one decoding session open (``START_REPLICATION``): the server decodes each
commit once and sends it at once, where every SQL-level peek starts a session over again.

The thread decodes the pgoutput stream (:class:`~outboxkit.relay.pgoutput.Decoder`) and hands
whole transactions to the event loop through a bounded queue (backpressure: when the relay
falls behind, the thread stops reading and the server keeps the rest). The loop calls
:meth:`SlotStream.confirm` with the end of the last transaction whose rows Kafka acknowledged
and whose DELETE committed; only that position is reported to the server as flushed, so the
slot never moves past an unacknowledged change (at least once). A slot has at most one
active replication connection, so a second relay cannot stream it by mistake.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import queue
import select
import threading
from collections.abc import Callable
from typing import Any

from outboxkit.outbox.extras import LOGICAL, require
from outboxkit.outbox.hosts import pg_address
from outboxkit.outbox.notify import listen_dsn
from outboxkit.relay.pgoutput import Decoder, Transaction
from sqlalchemy.engine import URL

log = logging.getLogger("outboxkit.relay")


def require_driver() -> None:
    """Raise :class:`~outboxkit.outbox.extras.MissingExtraError` unless psycopg2 is installed."""
    require(
        "psycopg2.extras", LOGICAL, "the logical relay's stream reader (not --logical-reader sql)"
    )


class StreamLost(ConnectionError):
    """The replication connection failed or ended; the relay treats it as a database outage
    (retried with backoff) and streams again from the slot's confirmed position."""

    outboxkit_safe_message = True  # its messages are written by outboxkit (outbox/secrecy.py)


class SlotStream:
    """One replication session on ``slot``: transactions in commit order, confirmed by the
    caller, their inserts decoded to the ``columns`` named per table
    (:class:`~outboxkit.relay.pgoutput.Decoder`). Start with :meth:`start`, read with
    :meth:`take`, end with :meth:`close`."""

    def __init__(
        self,
        db_url: str | URL,
        slot: str,
        publication: str,
        on_data: Callable[[], None],
        columns: dict[str, tuple[str, ...]],
        *,
        max_transactions: int = 1000,
        status_interval_s: float = 1.0,
        connect_timeout_s: float = 10.0,
    ) -> None:
        require_driver()
        self._dsn = listen_dsn(db_url)  # libpq tries its hosts in turn, each for the timeout
        connect_timeout_s = pg_address(db_url).timeout_or(connect_timeout_s) or 0.0
        self._slot = slot
        self._publication = publication
        self._on_data = on_data
        self._columns = columns
        self._status_interval_s = status_interval_s
        self._connect_timeout_s = connect_timeout_s
        self._queue: queue.Queue[Transaction] = queue.Queue(max_transactions)
        self._notified = False
        self._stopping = False
        self._error: BaseException | None = None
        self._confirmed = 0  # written by the loop, sent by the thread
        self._handed = 0  # end LSN of the last transaction queued
        self._received = 0  # LSN of the last marker message received
        self.up = False  # the server accepted START_REPLICATION
        self._wake_read, self._wake_write = os.pipe()
        self._loop_call: Callable[[Callable[[], None]], Any] | None = None
        self._thread: threading.Thread | None = None

    def start(self, call_soon_threadsafe: Callable[[Callable[[], None]], Any]) -> None:
        """Connect and stream in a new thread; ``call_soon_threadsafe`` runs callbacks on the
        loop (``loop.call_soon_threadsafe``)."""
        self._loop_call = call_soon_threadsafe
        self._thread = threading.Thread(
            target=self._run, name=f"outboxkit-slot-{self._slot}", daemon=True
        )
        self._thread.start()

    def take(self, max_rows: int) -> tuple[list[Transaction], bool]:
        """The transactions received so far (whole ones, in commit order), stopping after the
        one that reaches ``max_rows`` rows; and whether more are waiting. Raises
        :class:`StreamLost` once the stream has ended and everything before was taken."""
        self._notified = False
        taken: list[Transaction] = []
        rows = 0
        while rows < max_rows:
            try:
                transaction = self._queue.get_nowait()
            except queue.Empty:
                break
            taken.append(transaction)
            rows += len(transaction.inserts) or 1
        if not taken and self._error is not None:
            raise StreamLost(f"replication of slot {self._slot}: {_reason(self._error)}")
        return taken, not self._queue.empty()

    def confirm(self, lsn: int) -> None:
        """Report ``lsn`` to the server as flushed: everything before it is published."""
        if lsn > self._confirmed:
            self._confirmed = lsn
            self._wake()

    def caught_up(self, marker_lsn: int) -> bool:
        """Whether every transaction committed before the non-transactional message at
        ``marker_lsn`` was received and taken (the server sends that message after them)."""
        return self._received >= marker_lsn and self._queue.empty()

    async def close(self) -> None:
        """Report the confirmed position, end the session and wait for the thread."""
        self._stopping = True
        self._wake()
        thread = self._thread
        if thread is not None:
            while thread.is_alive():
                # Polled, not joined in an executor: close() may run while the loop shuts down.
                await asyncio.sleep(0.01)
        for descriptor in (self._wake_read, self._wake_write):
            with contextlib.suppress(OSError):
                os.close(descriptor)

    def _wake(self) -> None:
        with contextlib.suppress(OSError):
            os.write(self._wake_write, b"x")

    def _notify(self) -> None:
        if not self._notified and self._loop_call is not None:
            self._notified = True
            with contextlib.suppress(RuntimeError):  # the loop is closed
                self._loop_call(self._on_data)

    def _run(self) -> None:
        import psycopg2.extras  # present: __init__ required it

        connection = None
        try:
            connection = psycopg2.connect(
                self._dsn,
                connection_factory=psycopg2.extras.LogicalReplicationConnection,
                # libpq: whole seconds per host, 0 waits for ever
                connect_timeout=max(1, round(self._connect_timeout_s))
                if self._connect_timeout_s
                else 0,
            )
            cursor = connection.cursor()
            cursor.start_replication(
                slot_name=self._slot,
                decode=False,
                status_interval=self._status_interval_s,
                options={
                    "proto_version": "1",
                    "publication_names": self._publication,
                    "binary": "true",
                    "messages": "true",
                },
            )
            self.up = True
            log.debug("streaming slot %s", self._slot)
            self._stream(connection, cursor)
        except BaseException as error:  # handed to the loop: take() raises it
            if not self._stopping:
                self._error = error
        finally:
            if connection is not None:
                with contextlib.suppress(psycopg2.Error):
                    connection.close()
            self._notify()

    def _stream(self, connection: Any, cursor: Any) -> None:
        decoder = Decoder(self._columns)
        sent = 0
        while not self._stopping:
            message = cursor.read_message()
            if message is not None:
                transaction = decoder.feed(message.payload)
                if transaction is not None:
                    self._put(cursor, transaction)
                elif decoder.marker_lsn > self._received:
                    self._received = decoder.marker_lsn
                    self._notify()  # a drain waits for it
                continue
            # Nothing more to read now: everything the server sent before wal_end is here.
            if decoder.current is None and self._handed <= self._confirmed and self._queue.empty():
                # Every transaction received is confirmed: the slot may move on past the WAL
                # of other tables and databases, which it would otherwise keep.
                self._confirmed = max(self._confirmed, cursor.wal_end)
            if self._confirmed > sent:
                sent = self._confirmed
                cursor.send_feedback(write_lsn=sent, flush_lsn=sent)
            ready, _, _ = select.select([connection, self._wake_read], [], [], 1.0)
            if self._wake_read in ready:
                os.read(self._wake_read, 4096)
        cursor.send_feedback(write_lsn=self._confirmed, flush_lsn=self._confirmed, force=True)

    def _put(self, cursor: Any, transaction: Transaction) -> None:
        """Queue ``transaction``, waiting while the queue is full (the relay is behind); the
        server is still answered meanwhile, so it does not time the connection out."""
        while not self._stopping:
            try:
                self._queue.put(transaction, timeout=self._status_interval_s)
            except queue.Full:
                cursor.send_feedback(
                    write_lsn=self._confirmed, flush_lsn=self._confirmed, force=True
                )
                continue
            self._handed = transaction.end_lsn
            self._notify()
            return


def _reason(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__
