"""The fault-injection run: producers, two relays, three consumers, and faults all along.

While N events are written by three producer processes (some transactions rolled back on
purpose), relays and consumers are killed with SIGKILL at random moments and restarted, the
Kafka broker is restarted once and every database connection is cut once. At the end every
committed event must have been applied exactly once, in outbox order per key, and nothing from a
rolled-back transaction may appear anywhere. A seed makes the schedule repeatable.

Poison records (:mod:`tests.chaos.poison`) go in after every 1,000 committed events and must all
be dead-lettered, and one handler call hangs once (:mod:`tests.chaos.app`) until the handler
timeout frees it. A process is sent SIGTERM only once it logged its started line (its signal
handlers are in place from then on), and must exit 0.

    python -m tests.chaos.run --events 200000 --seed 7
"""

from __future__ import annotations

import argparse
import asyncio
import random
import re
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path

from outboxkit.outbox.db import make_engine
from outboxkit.outbox.tables import outbox_events
from outboxkit.testing.kafka import KafkaBroker, create_topic
from outboxkit.testing.postgres import throwaway_database
from outboxkit.testing.processes import kill, start_cli, terminate
from sqlalchemy import (
    BigInteger,
    Column,
    LargeBinary,
    MetaData,
    String,
    Table,
    func,
    select,
    text,
)
from sqlalchemy.engine import make_url

from tests.chaos.app import chaos_effects, chaos_metadata
from tests.chaos.poison import EVERY, POISON_HEADER, send_poison
from tests.support.kafka import read_topic

PARTITIONS = 6
STARTED = re.compile(r"\b(relay|consumer) \S+ started\b")
PRODUCERS = 3
KEYS_PER_PRODUCER = 40


@dataclass
class Summary:
    """What a run did and found."""

    seed: int
    committed_events: int = 0
    rolled_back_events: int = 0
    relay_kills: int = 0
    consumer_kills: int = 0
    broker_restarts: int = 0
    database_cuts: int = 0
    kafka_records: int = 0
    kafka_duplicates: int = 0
    duplicates_skipped_by_stopping_consumers: int = 0
    effect_rows: int = 0
    poison_records: int = 0
    poison_dead_lettered: int = 0
    handler_hangs: int = 0
    handler_timeouts: int = 0
    seconds_total: float = 0.0
    seconds_to_drain_after_last_fault: float = 0.0
    problems: list[str] = field(default_factory=list)


class Fleet:
    """The relay and consumer processes, each restartable under the same slot name."""

    def __init__(
        self, db_url: str, bootstrap: str, topic: str, logs: Path, mode: str = "poll"
    ) -> None:
        self.db_url, self.bootstrap, self.topic, self.logs = db_url, bootstrap, topic, logs
        self.mode = mode
        self.processes: dict[str, subprocess.Popen] = {}
        self.starts: defaultdict[str, int] = defaultdict(int)

    def start(self, slot: str) -> None:
        """Start (or restart) the process of ``slot`` (``relay-N`` or ``consumer-N``)."""
        self.starts[slot] += 1
        log = self.logs / f"{slot}.{self.starts[slot]}.log"
        if slot.startswith("relay"):
            args = ["relay", "--db-url", self.db_url, "--bootstrap", self.bootstrap]
            args += ["--lease-ttl", "3", "--request-timeout-ms", "1500", "--poll-interval", "0.2"]
            args += ["--retention", "86400", "--batch-size", "200", "--mode", self.mode]
            self.processes[slot] = start_cli(args, log)
        else:
            args = ["consume", "tests.chaos.app:app", "--db-url", self.db_url]
            args += ["--bootstrap", self.bootstrap]
            env = {
                "OUTBOXKIT_CHAOS_TOPIC": self.topic,
                "OUTBOXKIT_CHAOS_HANG_FILE": str(self.logs / "hang"),
            }
            self.processes[slot] = start_cli(args, log, env=env)

    def kill(self, slot: str) -> None:
        """SIGKILL the process of ``slot``, as a crash would."""
        kill(self.processes[slot])

    def wait_started(self, slot: str, timeout: float = 60.0) -> None:
        """Wait until the current process of ``slot`` logged its started line (or exited)."""
        log = self.logs / f"{slot}.{self.starts[slot]}.log"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.processes[slot].poll() is None:
            if log.exists() and STARTED.search(log.read_text(errors="replace")):
                return
            time.sleep(0.1)

    def stop_all(self) -> dict[str, int]:
        """SIGTERM everything still running, each once it has started; return the exit codes."""
        for slot in self.processes:
            self.wait_started(slot)
        return {slot: terminate(process, 60) for slot, process in self.processes.items()}


def _count(db_url: str, statement) -> int:
    engine = make_engine(db_url)
    with engine.connect() as conn:
        value = conn.scalar(statement)
    engine.dispose()
    return value


# Where committed events are counted: the outbox itself (the polling relay retains published
# rows), or in logical mode (which deletes them once published) a ledger the outbox's insert
# trigger fills in the producer's transaction.
chaos_ledger = Table(
    "chaos_ledger",
    MetaData(),
    Column("id", BigInteger, primary_key=True, autoincrement=False),
    Column("event_id", String(256), nullable=False),
    Column("kafka_key", LargeBinary),
)
LEDGER_TRIGGER = """
CREATE FUNCTION chaos_ledger_copy() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO chaos_ledger (id, event_id, kafka_key) VALUES (NEW.id, NEW.event_id, NEW.kafka_key);
    RETURN NULL;
END $$;
CREATE TRIGGER chaos_ledger_copy AFTER INSERT ON outbox_events
FOR EACH ROW EXECUTE FUNCTION chaos_ledger_copy();
"""
committed_rows: Table = outbox_events


def committed_count(db_url: str) -> int:
    """Events committed so far (see :data:`committed_rows`)."""
    return _count(db_url, select(func.count()).select_from(committed_rows))


def effect_count(db_url: str) -> int:
    """Effect rows written so far."""
    return _count(db_url, select(func.count()).select_from(chaos_effects))


def cut_database_connections(db_url: str) -> int:
    """Terminate every backend of the run's database, as a failover would."""
    database = make_url(db_url).database
    engine = make_engine(db_url)
    with engine.begin() as conn:
        cut = conn.scalar(
            text(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = :db AND pid <> pg_backend_pid()"
            ),
            {"db": database},
        )
    engine.dispose()
    return cut


def start_producers(db_url: str, topic: str, events: int, seed: int, workdir: Path) -> list:
    """Start the producer processes, each with its own keys; return them."""
    producers = []
    per_producer = events // PRODUCERS
    for index in range(PRODUCERS):
        first = index * KEYS_PER_PRODUCER
        count = per_producer + (events % PRODUCERS if index == 0 else 0)
        command = [sys.executable, "-m", "tests.chaos.producer", "--db-url", db_url]
        command += ["--topic", topic, "--keys", f"{first}:{first + KEYS_PER_PRODUCER}"]
        command += ["--events", str(count), "--seed", str(seed * 100 + index)]
        command += ["--rolled-back-file", str(workdir / "rolled-back.txt")]
        log = open(workdir / f"producer-{index}.log", "ab")  # noqa: SIM115 - child writes it
        producers.append(subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT))
        log.close()
    return producers


def run_chaos(
    events: int,
    seed: int,
    kills_each: int = 10,
    workdir: Path | None = None,
    drain_timeout: float = 600.0,
    mode: str = "poll",
) -> Summary:
    """Run the whole scenario and return its summary (``problems`` empty when all held).

    ``mode``: the relays' ``--mode`` (``logical``: two relays on one slot, one a standby).
    """
    global committed_rows
    workdir = workdir or Path(tempfile.mkdtemp(prefix="outboxkit-chaos-"))
    rng = random.Random(seed)
    summary = Summary(seed=seed)
    started = time.monotonic()
    topic = f"chaos-{seed}-{rng.randrange(16**6):06x}"
    broker = KafkaBroker()
    broker.start()
    try:
        with throwaway_database("outboxkit_chaos") as db_url:
            engine = make_engine(db_url)
            chaos_metadata.create_all(engine)
            committed_rows = outbox_events
            if mode == "logical":
                chaos_ledger.create(engine)
                with engine.begin() as conn:
                    conn.exec_driver_sql(LEDGER_TRIGGER)
                committed_rows = chaos_ledger
            engine.dispose()
            asyncio.run(create_topic(broker.bootstrap, topic, PARTITIONS))
            fleet = Fleet(db_url, broker.bootstrap, topic, workdir, mode)
            for slot in ("relay-1", "relay-2", "consumer-1", "consumer-2", "consumer-3"):
                fleet.start(slot)
            producers = start_producers(db_url, topic, events, seed, workdir)
            last_fault = _inject_faults(fleet, broker, producers, db_url, rng, kills_each, summary)
            _wait_for_effects(db_url, drain_timeout, summary)
            _wait_for_poison(broker.bootstrap, topic, drain_timeout, summary)
            summary.seconds_to_drain_after_last_fault = time.monotonic() - last_fault
            codes = fleet.stop_all()
            bad_exits = {slot: code for slot, code in codes.items() if code != 0}
            if bad_exits:
                summary.problems.append(f"processes did not exit 0 on SIGTERM: {bad_exits}")
            if any(p.wait() != 0 for p in producers):
                summary.problems.append("a producer failed")
            _check(db_url, broker.bootstrap, topic, workdir, summary)
    finally:
        broker.close()
    summary.seconds_total = time.monotonic() - started
    return summary


def _inject_faults(fleet, broker, producers, db_url, rng, kills_each, summary) -> float:
    """Kill and restart at random moments until every quota is met and the producers are done."""
    slots = {
        "relay": ["relay-1", "relay-2"],
        "consumer": ["consumer-1", "consumer-2", "consumer-3"],
    }
    kills = {"relay": 0, "consumer": 0}
    broker_done = cut_done = False
    last_fault = time.monotonic()
    while True:
        producing = any(p.poll() is None for p in producers)
        quotas_met = min(kills.values()) >= kills_each and broker_done and cut_done
        if quotas_met and not producing:
            _add_poison(fleet, committed_count(db_url), summary)
            return last_fault
        time.sleep(rng.uniform(0.5, 2.0))
        progress = committed_count(db_url)
        _add_poison(fleet, progress, summary)
        if not broker_done and progress > 0 and kills["relay"] >= kills_each // 2:
            broker.stop()
            time.sleep(rng.uniform(1.0, 3.0))
            broker.start()
            broker_done, summary.broker_restarts = True, 1
        elif not cut_done and broker_done:
            cut_done = cut_database_connections(db_url) > 0
            summary.database_cuts = int(cut_done)
        else:
            kind = min(kills, key=lambda k: (kills[k], rng.random()))
            if kills[kind] >= kills_each:
                kind = rng.choice(list(kills))
            slot = rng.choice(slots[kind])
            fleet.kill(slot)
            kills[kind] += 1
            time.sleep(rng.uniform(0.0, 1.0))
            fleet.start(slot)
        last_fault = time.monotonic()
        summary.relay_kills, summary.consumer_kills = kills["relay"], kills["consumer"]


def _add_poison(fleet: Fleet, committed: int, summary: Summary) -> None:
    """Write the poison records due: one per 1,000 committed events so far."""
    due = list(range(summary.poison_records, committed // EVERY))
    if due:
        try:
            asyncio.run(send_poison(fleet.bootstrap, fleet.topic, due))
        except Exception as error:  # the broker is being restarted: try again next round
            print(f"poison records not written yet: {type(error).__name__}", file=sys.stderr)
            return
        summary.poison_records += len(due)


def _wait_for_effects(db_url: str, timeout: float, summary: Summary) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        committed, applied = committed_count(db_url), effect_count(db_url)
        if committed and applied >= committed:
            return
        time.sleep(0.5)
    summary.problems.append(
        f"not drained after {timeout:.0f}s: {effect_count(db_url)} effects "
        f"for {committed_count(db_url)} committed events"
    )


def _check(db_url: str, bootstrap: str, topic: str, workdir: Path, summary: Summary) -> None:
    engine = make_engine(db_url)
    with engine.connect() as conn:
        outbox_rows = conn.execute(
            select(committed_rows.c.event_id, committed_rows.c.kafka_key).order_by(
                committed_rows.c.id
            )
        ).all()
        effects = conn.execute(
            select(chaos_effects.c.event_id, chaos_effects.c.key).order_by(chaos_effects.c.id)
        ).all()
    engine.dispose()
    committed_ids = [row.event_id for row in outbox_rows]
    applied_ids = [row.event_id for row in effects]
    rolled_back = set((workdir / "rolled-back.txt").read_text().split())
    summary.committed_events = len(committed_ids)
    summary.rolled_back_events = len(rolled_back)
    summary.effect_rows = len(applied_ids)
    if len(set(applied_ids)) != len(applied_ids):
        summary.problems.append(f"{len(applied_ids) - len(set(applied_ids))} effects applied twice")
    if set(applied_ids) != set(committed_ids):
        missing = set(committed_ids) - set(applied_ids)
        summary.problems.append(f"{len(missing)} committed events never applied")
    if rolled_back & (set(committed_ids) | set(applied_ids)):
        summary.problems.append("an event of a rolled-back transaction was written or applied")
    outbox_order: defaultdict[bytes, list[str]] = defaultdict(list)
    for row in outbox_rows:
        outbox_order[row.kafka_key.decode()].append(row.event_id)
    effect_order: defaultdict[str, list[str]] = defaultdict(list)
    for row in effects:
        effect_order[row.key].append(row.event_id)
    broken = [key for key in outbox_order if outbox_order[key] != effect_order.get(key)]
    if broken:
        summary.problems.append(f"effects out of outbox order for keys {broken[:5]}")
    records = asyncio.run(read_topic(bootstrap, topic, expected=len(committed_ids), timeout=120))
    events = [dict(r.headers) for r in records]
    record_ids = [h["ce_id"].decode() for h in events if POISON_HEADER not in h]
    summary.kafka_records = len(record_ids)
    summary.kafka_duplicates = len(record_ids) - len(set(record_ids))
    if rolled_back & set(record_ids):
        summary.problems.append("an event of a rolled-back transaction reached Kafka")
    for log in workdir.glob("consumer-*.log"):
        text = log.read_text(errors="replace")
        for match in re.finditer(r"stopped: .*?duplicates=(\d+)", text):
            summary.duplicates_skipped_by_stopping_consumers += int(match.group(1))
        summary.handler_timeouts += len(re.findall(r"handler \S+ timed out after", text))
    summary.handler_hangs = int((workdir / "hang").exists())
    if not summary.handler_hangs:
        summary.problems.append("the handler meant to hang once never did")


def _poison_dead_lettered(bootstrap: str, topic: str, written: int) -> int:
    """How many of the ``written`` poison records are in the dead-letter topic."""
    letters = asyncio.run(read_topic(bootstrap, f"{topic}.dlq", expected=written, timeout=10))
    numbers = {
        value.decode()
        for letter in letters
        for name, value in letter.headers
        if name == POISON_HEADER and value is not None
    }
    return len(numbers & {str(n) for n in range(written)})


def _wait_for_poison(bootstrap: str, topic: str, timeout: float, summary: Summary) -> None:
    """Wait until every poison record written is dead-lettered (none applied: see _check)."""
    deadline = time.monotonic() + timeout
    while True:
        found = _poison_dead_lettered(bootstrap, topic, summary.poison_records)
        summary.poison_dead_lettered = found
        if found == summary.poison_records:
            return
        if time.monotonic() > deadline:
            summary.problems.append(
                f"{summary.poison_records - found} of {summary.poison_records} poison records "
                "not dead-lettered"
            )
            return
        time.sleep(1.0)


def main() -> None:
    """Run by hand at any size and print the summary."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--kills", type=int, default=10, help="kills of each kind, at least")
    parser.add_argument("--mode", choices=["poll", "logical"], default="poll")
    args = parser.parse_args()
    summary = run_chaos(args.events, args.seed, args.kills, drain_timeout=3600, mode=args.mode)
    for name, value in asdict(summary).items():
        print(f"{name:45} {value}")
    sys.exit(1 if summary.problems else 0)


if __name__ == "__main__":
    main()
