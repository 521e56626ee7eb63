"""A producer process of the chaos run: writes steps of its own keys, rolls some back.

Each producer owns a disjoint set of keys and writes them sequentially, so outbox order per key
is the order of its steps. About one transaction in ten is rolled back on purpose; the ids of
its events are written to ``--rolled-back-file`` so the run can prove they appear nowhere.

    python -m tests.chaos.producer --db-url URL --topic T --keys 0:40 --events 5000 --seed 1
"""

from __future__ import annotations

import argparse
import random
import sys
import time

from outboxkit.outbox import Outbox, new_event
from outboxkit.outbox.db import make_engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from tests.chaos.app import EVENT_TYPE


class RollBack(Exception):
    """Raised inside a transaction to roll it back on purpose."""


def main() -> None:
    """Write ``--events`` committed steps over the key range, then print the count."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--db-url", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--keys", required=True, help="FIRST:LAST (exclusive) key numbers")
    parser.add_argument("--events", type=int, required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--rolled-back-file", required=True)
    args = parser.parse_args()
    first, last = (int(part) for part in args.keys.split(":"))
    rng = random.Random(args.seed)
    engine = make_engine(args.db_url, pool_pre_ping=True)
    outbox = Outbox(default_topic=args.topic)
    next_seq = {n: 0 for n in range(first, last)}
    committed = 0
    with open(args.rolled_back_file, "a") as rolled_back:
        while committed < args.events:
            size = min(rng.randint(1, 20), args.events - committed)
            doomed = rng.random() < 0.1
            steps = [rng.randrange(first, last) for _ in range(size)]
            ids: list[str] = []
            try:
                with Session(engine) as session, session.begin():
                    seqs = dict(next_seq)
                    for key_number in steps:
                        key = f"key-{key_number}"
                        data = {"key": key, "seq": seqs[key_number]}
                        seqs[key_number] += 1
                        event = new_event(EVENT_TYPE, "/chaos", data, partitionkey=key)
                        ids.append(event.get_id())
                        outbox.add(session, event)
                    if doomed:
                        raise RollBack
            except RollBack:
                rolled_back.write("".join(f"{event_id}\n" for event_id in ids))
                rolled_back.flush()
                continue
            except DBAPIError:
                # The run cuts database connections on purpose: this transaction did not
                # commit (or its outcome is unknown); its steps are written again below.
                time.sleep(0.2)
                continue
            next_seq = seqs
            committed += size
    engine.dispose()
    print(f"committed {committed}", file=sys.stderr)


if __name__ == "__main__":
    main()
