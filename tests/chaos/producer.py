"""A producer process of the chaos run: writes steps of its own keys, rolls some back.

Each producer owns a disjoint set of keys and writes them sequentially, so outbox order per key
is the order of its steps. About one transaction in ten is rolled back on purpose, about one
in four adds some of its steps inside a savepoint (sometimes nested) that is rolled back or
released, and about one in thirty is abandoned: the session is dropped without commit,
rollback or close, its connection going back to the pool through the garbage collector. The ids
of every event that must never appear are written to ``--rolled-back-file``.

``--wal-messages``: the events are WAL messages sent with the COMMIT
(``Outbox(wal_messages=True, emit_at_commit=True)``), which leave no row behind, so the
producer writes each event's ledger row (``chaos_ledger``) itself, in the same transaction and
savepoint as the event: the ledger holds exactly the committed events. Without it the events
are rows (a trigger fills the ledger in logical mode; in poll mode the table is the ledger).

``--bad-every N`` (the sequence variant): about one step in N is marked ``bad`` (its handler
fails until the run's operator fixes it, see :mod:`tests.chaos.app`).

The run pauses the producers (``--pause-file``): while that file exists a producer starts no
transaction, and says so by creating ``<pause-file>.<first key>``.

    python -m tests.chaos.producer --db-url URL --topic T --keys 0:40 --events 5000 --seed 1
"""

from __future__ import annotations

import argparse
import gc
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path

from cloudevents.core.v1.event import CloudEvent
from outboxkit.outbox import Outbox, new_event
from outboxkit.outbox.db import make_engine
from sqlalchemy import insert
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from tests.chaos.app import EVENT_TYPE
from tests.chaos.ledger import chaos_ledger


class RollBack(Exception):
    """Raised inside a transaction to roll it back on purpose."""


class Transaction:
    """One transaction's steps: the events it adds, and which of them must never appear."""

    def __init__(
        self,
        session: Session,
        outbox: Outbox,
        ledger: bool,
        next_seq: dict[int, int],
        bad: Callable[[], bool] = lambda: False,
    ) -> None:
        self.session, self.outbox, self.ledger, self.bad = session, outbox, ledger, bad
        self.seqs = dict(next_seq)
        self.added: list[str] = []
        self.doomed: list[str] = []
        self.committed_steps = 0

    def add(self, key_number: int) -> None:
        """Add the next step of ``key_number``."""
        key = f"key-{key_number}"
        data: dict[str, object] = {"key": key, "seq": self.seqs[key_number]}
        if self.bad():
            data.update(bad=True, at=time.time())
        event: CloudEvent = new_event(EVENT_TYPE, "/chaos", data, partitionkey=key)
        self.seqs[key_number] += 1
        self.added.append(event.get_id())
        self.outbox.add(self.session, event)
        if self.ledger:
            self.session.execute(
                insert(chaos_ledger).values(event_id=event.get_id(), kafka_key=key.encode())
            )

    def savepoint(self, rng: random.Random, keys: list[int], depth: int = 0) -> None:
        """Add a few steps inside a savepoint, rolled back or released (maybe nested)."""
        seqs, added = dict(self.seqs), len(self.added)
        savepoint = self.session.begin_nested()
        for _ in range(rng.randint(1, 3)):
            self.add(rng.choice(keys))
        if depth == 0 and rng.random() < 0.3:
            self.savepoint(rng, keys, depth + 1)
        if rng.random() < 0.5:
            savepoint.rollback()
            self.doomed += self.added[added:]
            self.added[added:] = []
            self.seqs = seqs
        else:
            savepoint.commit()


def main() -> None:
    """Write ``--events`` committed steps over the key range, then print the count."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--db-url", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--keys", required=True, help="FIRST:LAST (exclusive) key numbers")
    parser.add_argument("--events", type=int, required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--rolled-back-file", required=True)
    parser.add_argument("--wal-messages", action="store_true")
    parser.add_argument("--pause-file")
    parser.add_argument("--bad-every", type=int, default=0, help="mark ~1 step in N bad")
    args = parser.parse_args()
    first, last = (int(part) for part in args.keys.split(":"))
    rng = random.Random(args.seed)
    engine = make_engine(args.db_url, pool_pre_ping=True)
    if args.wal_messages:
        outbox = Outbox(default_topic=args.topic, wal_messages=True, emit_at_commit=True)
    else:
        outbox = Outbox(default_topic=args.topic)
    keys = list(range(first, last))
    next_seq = {n: 0 for n in keys}
    committed = 0
    bad_rng = random.Random(args.seed + 1)  # its own stream: the schedule stays the same

    def bad() -> bool:
        return args.bad_every > 0 and bad_rng.randrange(args.bad_every) == 0

    with open(args.rolled_back_file, "a") as rolled_back:

        def never(ids: list[str]) -> None:
            rolled_back.write("".join(f"{event_id}\n" for event_id in ids))
            rolled_back.flush()

        while committed < args.events:
            if args.pause_file:
                wait_while_paused(Path(args.pause_file), first)
            size = min(rng.randint(1, 20), args.events - committed)
            doomed = rng.random() < 0.1
            abandoned = not doomed and rng.random() < 0.03
            with_savepoint = rng.random() < 0.25
            steps = [rng.choice(keys) for _ in range(size)]
            at = rng.randrange(size + 1)
            try:
                if abandoned:
                    session = Session(engine)
                    tx = Transaction(session, outbox, args.wal_messages, next_seq, bad)
                    session.begin()
                    for key_number in steps:
                        tx.add(key_number)
                    if with_savepoint:
                        session.begin_nested()
                        tx.add(rng.choice(keys))
                    never(tx.added + tx.doomed)
                    del session, tx  # no commit, rollback or close: the collector returns it
                    gc.collect()
                    continue
                with Session(engine) as session, session.begin():
                    tx = Transaction(session, outbox, args.wal_messages, next_seq, bad)
                    for index, key_number in enumerate(steps):
                        if with_savepoint and index == at:
                            tx.savepoint(rng, keys)
                        tx.add(key_number)
                    if with_savepoint and at == size:
                        tx.savepoint(rng, keys)
                    if doomed:
                        raise RollBack
            except RollBack:
                never(tx.added + tx.doomed)
                continue
            except DBAPIError:
                # The run cuts database connections on purpose: this transaction did not
                # commit (or its outcome is unknown); its steps are written again below.
                time.sleep(0.2)
                continue
            never(tx.doomed)
            next_seq = tx.seqs
            committed += len(tx.added)
    engine.dispose()
    print(f"committed {committed}", file=sys.stderr)


def wait_while_paused(pause: Path, first_key: int) -> None:
    """Start no transaction while ``pause`` exists; say so with ``<pause>.<first_key>``."""
    said = pause.with_name(f"{pause.name}.{first_key}")
    while pause.exists():
        said.touch()
        time.sleep(0.05)
    said.unlink(missing_ok=True)


if __name__ == "__main__":
    main()
