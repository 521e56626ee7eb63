"""The fault-injection run: producers, two relays, three consumers, and faults all along.

While N events are written by three producer processes (some transactions rolled back on
purpose, some steps in savepoints rolled back, some sessions abandoned), relays and consumers
are killed with SIGKILL at random moments and restarted, the Kafka broker is restarted, every
database connection is cut, and in logical mode the replication slot may be dropped. At the
end every committed event must have been applied exactly once, in outbox order per key,
nothing from a rolled-back transaction or savepoint may appear anywhere, and the outbox table
must hold no unpublished row. A seed makes the schedule repeatable.

Three variants: ``--mode poll``; ``--mode logical`` (two relays on one slot, one a standby)
with the events as rows; ``--mode logical --wal-messages`` with the events as WAL messages sent
with the COMMIT (``Outbox(wal_messages=True, emit_at_commit=True)``). ``--sequence`` runs any
of them with the consumers keeping each key's order behind a dead letter
(``on_dead_letter="sequence"``): about one step in :data:`BAD_EVERY` is marked bad and fails
until the run's operator fixes it and replays its letter (``outboxkit dlq replay``, every
:data:`REPLAY_EVERY_S` seconds and at the end), so keys are blocked, their later steps held and
released again all through the faults, and every key's effects must still be in outbox order.

``--cluster`` runs any of them on a three-node Kafka cluster (replication factor 3,
``min.insync.replicas`` 2; :mod:`outboxkit.testing.kafka_cluster`) and adds its faults: a
partition leader killed with SIGKILL and started again (``--leader-kills``), a leader frozen
with SIGSTOP until the cluster moves its partitions away, then thawed (``--freezes``), and
rolling restarts of every node, each once the replicas are in sync (``--rolling-restarts``).
``--broker-restarts`` then restarts the whole cluster. The relays and consumers are given every
node's address.

Poison records (:mod:`tests.chaos.poison`) go in after every 1,000 committed events and must all
be dead-lettered, and one handler call hangs once (:mod:`tests.chaos.app`) until the handler
timeout frees it. A process is sent SIGTERM only once it logged its started line (its signal
handlers are in place from then on), and must exit 0.

    python -m tests.chaos.run --events 200000 --mode logical --wal-messages \
        --relay-kills 50 --consumer-kills 50 --broker-restarts 2 --database-cuts 2 --slot-drops 1
    python -m tests.chaos.run --events 100000 --cluster --leader-kills 20 --freezes 5 \
        --rolling-restarts 5 --broker-restarts 0
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

from outboxkit.consumers.sequences import key_hash
from outboxkit.consumers.tables import consumer_held_events, consumer_sequences
from outboxkit.outbox.db import make_engine
from outboxkit.outbox.tables import outbox_events
from outboxkit.testing.kafka import KafkaBroker, create_topic
from outboxkit.testing.kafka_cluster import KafkaCluster
from outboxkit.testing.postgres import throwaway_database
from outboxkit.testing.processes import kill, start_cli, terminate
from sqlalchemy import Table, func, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

from tests.chaos.app import chaos_effects, chaos_metadata
from tests.chaos.ledger import LEDGER_TRIGGER, chaos_ledger
from tests.chaos.poison import EVERY, POISON_HEADER, poison_record, send_poison
from tests.support.kafka import read_topic
from tests.support.ops import cli_process
from tests.support.waits import scaled

PARTITIONS = 6
STARTED = re.compile(r"\b(relay|consumer) \S+ started\b")
PRODUCERS = 3
FLEET = ("relay-1", "relay-2", "consumer-1", "consumer-2", "consumer-3")
KEYS_PER_PRODUCER = 40
BAD_EVERY = 500
REPLAY_EVERY_S = 15.0


@dataclass
class Summary:
    """What a run did and found."""

    seed: int
    variant: str = "poll"
    committed_events: int = 0
    rolled_back_events: int = 0
    relay_kills: int = 0
    consumer_kills: int = 0
    broker_restarts: int = 0
    database_cuts: int = 0
    slot_drops: int = 0
    leader_kills: int = 0
    leader_freezes: int = 0
    rolling_restarts: int = 0
    lost_events: int = 0
    duplicate_effects: int = 0
    keys_out_of_order: int = 0
    outbox_rows_left: int = 0
    kafka_records: int = 0
    kafka_duplicates: int = 0
    duplicates_skipped_by_stopping_consumers: int = 0
    effect_rows: int = 0
    replay_rounds: int = 0
    letters_replayed: int = 0
    keys_blocked_at_end: int = 0
    event_keys_blocked: int = 0  # times a key of the run's events was blocked (all logs)
    key_releases: int = 0  # times a blocked key's held records were applied (all logs)
    records_held_at_end: int = 0
    poison_records: int = 0
    poison_dead_lettered: int = 0
    handler_hangs: int = 0
    handler_timeouts: int = 0
    seconds_total: float = 0.0
    seconds_to_drain_after_last_fault: float = 0.0
    problems: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Faults:
    """How many faults of each kind a run injects, at least (kills go on while producing)."""

    relay_kills: int = 10
    consumer_kills: int = 10
    broker_restarts: int = 1
    database_cuts: int = 1
    slot_drops: int = 0
    leader_kills: int = 0  # the cluster variant's faults
    leader_freezes: int = 0
    rolling_restarts: int = 0

    def for_cluster(self) -> bool:
        """Whether any fault needs the three-node cluster."""
        return bool(self.leader_kills or self.leader_freezes or self.rolling_restarts)


class Fleet:
    """The relay and consumer processes, each restartable under the same slot name."""

    def __init__(
        self,
        db_url: str,
        bootstrap: str,
        topic: str,
        logs: Path,
        mode: str = "poll",
        on_dead_letter: str = "continue",
    ) -> None:
        self.db_url, self.bootstrap, self.topic, self.logs = db_url, bootstrap, topic, logs
        self.mode, self.on_dead_letter = mode, on_dead_letter
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
                "OUTBOXKIT_CHAOS_ON_DEAD_LETTER": self.on_dead_letter,
                "OUTBOXKIT_CHAOS_FIXED_FILE": str(self.logs / "fixed"),
            }
            self.processes[slot] = start_cli(args, log, env=env)

    def kill(self, slot: str) -> None:
        """SIGKILL the process of ``slot``, as a crash would."""
        kill(self.processes[slot])

    def wait_started(self, slot: str, timeout: float = 60.0) -> None:
        """Wait until the current process of ``slot`` logged its started line (or exited)."""
        log = self.logs / f"{slot}.{self.starts[slot]}.log"
        deadline = time.monotonic() + scaled(timeout)
        while time.monotonic() < deadline and self.processes[slot].poll() is None:
            if log.exists() and STARTED.search(log.read_text(errors="replace")):
                return
            time.sleep(0.1)

    def kill_all(self) -> None:
        """SIGKILL whatever is still running (a run that ends early leaves nothing behind)."""
        for process in self.processes.values():
            if process.poll() is None:
                kill(process)

    def stop_all(self) -> dict[str, int]:
        """SIGTERM everything still running, each once it has started; return the exit codes."""
        for slot in self.processes:
            self.wait_started(slot)
        return {slot: terminate(process, scaled(60)) for slot, process in self.processes.items()}


def _count(db_url: str, statement) -> int:
    engine = make_engine(db_url)
    with engine.connect() as conn:
        value = conn.scalar(statement)
    engine.dispose()
    return value


# Where committed events are counted (tests.chaos.ledger): the outbox itself in poll mode,
# the ledger in logical mode.
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


def start_producers(
    db_url: str,
    topic: str,
    events: int,
    seed: int,
    workdir: Path,
    wal_messages: bool = False,
    bad_every: int = 0,
) -> list:
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
        command += ["--pause-file", str(workdir / "pause")]
        if wal_messages:
            command.append("--wal-messages")
        if bad_every:
            command += ["--bad-every", str(bad_every)]
        log = open(workdir / f"producer-{index}.log", "ab")  # noqa: SIM115 - child writes it
        producers.append(subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT))
        log.close()
    return producers


def run_chaos(
    events: int,
    seed: int,
    faults: Faults = Faults(),
    workdir: Path | None = None,
    drain_timeout: float = 600.0,
    mode: str = "poll",
    wal_messages: bool = False,
    sequence: bool = False,
    cluster: bool = False,
) -> Summary:
    """Run the whole scenario and return its summary (``problems`` empty when all held).

    ``mode``: the relays' ``--mode`` (``logical``: two relays on one slot, one a standby);
    ``wal_messages`` (logical mode): the producers write WAL messages sent with the COMMIT.
    ``sequence``: the consumers keep each key's order behind a dead letter, bad steps are
    fixed and replayed by the run's operator (see the module's notes).
    ``cluster``: a three-node Kafka cluster instead of one broker (see the module's notes).
    ``drain_timeout`` is a quiet machine's figure (:func:`~tests.support.waits.scaled`).
    """
    global committed_rows
    if wal_messages and mode != "logical":
        raise ValueError("WAL messages need the logical mode")
    if faults.slot_drops and mode != "logical":
        raise ValueError("slot drops need the logical mode")
    if faults.for_cluster() and not cluster:
        raise ValueError("leader kills, freezes and rolling restarts need the cluster")
    workdir = workdir or Path(tempfile.mkdtemp(prefix="outboxkit-chaos-"))
    rng = random.Random(seed)
    variant = (
        mode
        + (" + WAL messages" if wal_messages else "")
        + (" + sequence" if sequence else "")
        + (" + cluster" if cluster else "")
    )
    summary = Summary(seed=seed, variant=variant)
    started = time.monotonic()
    topic = f"chaos-{seed}-{rng.randrange(16**6):06x}"
    broker: KafkaBroker | KafkaCluster = KafkaCluster() if cluster else KafkaBroker()
    broker.start()
    try:
        with throwaway_database("outboxkit_chaos") as db_url:
            engine = make_engine(db_url)
            chaos_metadata.create_all(engine)
            committed_rows = outbox_events
            if mode == "logical":
                chaos_ledger.create(engine)
                if not wal_messages:
                    with engine.begin() as conn:
                        conn.exec_driver_sql(LEDGER_TRIGGER)
                committed_rows = chaos_ledger
            engine.dispose()
            replicas = 3 if cluster else 1
            asyncio.run(create_topic(broker.bootstrap, topic, PARTITIONS, replicas))
            policy = "sequence" if sequence else "continue"
            fleet = Fleet(db_url, broker.bootstrap, topic, workdir, mode, policy)
            operator = Operator(fleet, workdir, summary) if sequence else None
            producers: list[subprocess.Popen] = []
            try:
                for slot in FLEET:
                    fleet.start(slot)
                for slot in FLEET:
                    fleet.wait_started(slot, 120)
                if mode == "logical" and not _wait_for_slot(db_url, scaled(60)):
                    # A WAL message committed before the slot exists is in no slot: none is
                    # lost only if the producers start once it exists.
                    summary.problems.append("the relays created no replication slot")
                bad_every = BAD_EVERY if sequence else 0
                producers = start_producers(
                    db_url, topic, events, seed, workdir, wal_messages, bad_every
                )
                run = _Run(fleet, broker, producers, db_url, rng, summary, workdir, wal_messages)
                run.operator = operator
                last_fault = run.inject(faults)
                _wait_for_effects(db_url, scaled(drain_timeout), summary, operator)
                _wait_for_poison(broker.bootstrap, topic, scaled(drain_timeout), summary)
                _wait_for_empty_outbox(db_url, mode, scaled(60), summary)
                summary.seconds_to_drain_after_last_fault = time.monotonic() - last_fault
                codes = fleet.stop_all()
                bad_exits = {slot: code for slot, code in codes.items() if code != 0}
                if bad_exits:
                    summary.problems.append(f"processes did not exit 0 on SIGTERM: {bad_exits}")
                if any(p.wait() != 0 for p in producers):
                    summary.problems.append("a producer failed")
            finally:
                fleet.kill_all()
                for producer in producers:
                    if producer.poll() is None:
                        kill(producer)
            _check(db_url, broker.bootstrap, topic, workdir, summary)
            if sequence:
                _check_sequences(db_url, summary)
    finally:
        broker.close()
    summary.seconds_total = time.monotonic() - started
    return summary


class _Run:
    """The fault schedule of one run: which fault comes next, and each fault's procedure."""

    def __init__(self, fleet, broker, producers, db_url, rng, summary, workdir, wal_messages):
        self.fleet, self.broker, self.producers = fleet, broker, producers
        self.db_url, self.rng, self.summary = db_url, rng, summary
        self.pause = workdir / "pause"
        self.wal_messages = wal_messages
        self.operator: Operator | None = None

    def inject(self, faults: Faults) -> float:
        """Inject faults at random moments until every quota is met and the producers are
        done; return when the last one was."""
        rng, summary = self.rng, self.summary
        quota = {
            "relay": faults.relay_kills,
            "consumer": faults.consumer_kills,
            "broker": faults.broker_restarts,
            "cut": faults.database_cuts,
            "slot": faults.slot_drops,
            "leader": faults.leader_kills,
            "freeze": faults.leader_freezes,
            "rolling": faults.rolling_restarts,
        }
        done = dict.fromkeys(quota, 0)
        kill_quota = quota["relay"] + quota["consumer"]
        last_fault = time.monotonic()
        while True:
            producing = any(p.poll() is None for p in self.producers)
            if all(done[kind] >= quota[kind] for kind in quota) and not producing:
                _add_poison(self.fleet, committed_count(self.db_url), summary)
                return last_fault
            time.sleep(rng.uniform(0.5, 2.0))
            if self.operator is not None:
                self.operator.maybe_replay()
            progress = committed_count(self.db_url)
            _add_poison(self.fleet, progress, summary)
            kills_done = (done["relay"] + done["consumer"]) / kill_quota if kill_quota else 1.0
            # The rare faults are spread over the run: each waits for its share of the kills.
            rare = [
                kind
                for kind in ("broker", "cut", "slot", "leader", "freeze", "rolling")
                if done[kind] < quota[kind]
                and progress > 0
                and kills_done >= (done[kind] + 0.5) / quota[kind]
            ]
            owed = [kind for kind in ("relay", "consumer") if done[kind] < quota[kind]]
            if rare:
                kind = rare[0]
            elif owed:
                kind = min(owed, key=lambda k: (done[k] / quota[k], rng.random()))
            elif kill_quota:
                kind = rng.choice([k for k in ("relay", "consumer") if quota[k]])
            else:
                continue
            if getattr(self, f"_{kind}")():
                done[kind] += 1
            last_fault = time.monotonic()
            summary.relay_kills, summary.consumer_kills = done["relay"], done["consumer"]
            summary.broker_restarts, summary.database_cuts = done["broker"], done["cut"]
            summary.slot_drops = done["slot"]
            summary.leader_kills, summary.leader_freezes = done["leader"], done["freeze"]
            summary.rolling_restarts = done["rolling"]

    def _relay(self) -> bool:
        return self._kill(self.rng.choice(["relay-1", "relay-2"]))

    def _consumer(self) -> bool:
        return self._kill(self.rng.choice(["consumer-1", "consumer-2", "consumer-3"]))

    def _kill(self, slot: str) -> bool:
        self.fleet.kill(slot)
        time.sleep(self.rng.uniform(0.0, 1.0))
        self.fleet.start(slot)
        # The next fault waits for this process to be up: on a loaded machine a start takes
        # seconds, and kills faster than that would only ever kill processes starting.
        self.fleet.wait_started(slot)
        return True

    def _broker(self) -> bool:
        self.broker.stop()
        time.sleep(self.rng.uniform(1.0, 3.0))
        self.broker.start()
        return True

    def _cluster(self) -> KafkaCluster:
        assert isinstance(self.broker, KafkaCluster)
        # As an operator would: a fault only once every replica is back in sync (two nodes
        # down at once would stop every acks=all write, a test of its own).
        self.broker.wait_in_sync([self.fleet.topic], scaled(120))
        return self.broker

    def _leader(self) -> bool:
        """Kill the leader of a random partition with SIGKILL, start it again soon after."""
        cluster = self._cluster()
        leader = cluster.leader(self.fleet.topic, self.rng.randrange(PARTITIONS))
        leader.kill()
        time.sleep(self.rng.uniform(1.0, 5.0))
        leader.start()
        return True

    def _freeze(self) -> bool:
        """Freeze the leader of a random partition (SIGSTOP: its sockets stay open and silent)
        until the cluster has moved that partition away, a little longer at times; thaw it."""
        cluster = self._cluster()
        partition = self.rng.randrange(PARTITIONS)
        leader = cluster.leader(self.fleet.topic, partition)
        leader.freeze()
        try:
            cluster.wait_leader_moved(self.fleet.topic, partition, leader, scaled(60))
            time.sleep(self.rng.uniform(0.0, 10.0))
        finally:
            leader.thaw()
        return True

    def _rolling(self) -> bool:
        """Restart every node, one after the other, as an upgrade is rolled out."""
        self._cluster().rolling_restart([self.fleet.topic])
        return True

    def _cut(self) -> bool:
        return cut_database_connections(self.db_url) > 0

    def _slot(self) -> bool:
        """Drop the replication slot under the running relays, which must make it again.

        Rows committed meanwhile are published from the table by the new slot's catch-up; a
        WAL message committed while no slot exists is in no slot (the documented gap), so with
        WAL messages the producers are paused first and every committed event applied.
        """
        if not self.wal_messages:
            return drop_slot(self.db_url, scaled(30))
        self.pause.touch()
        try:
            _wait_for_pause(self.producers, self.pause, scaled(60))
            if not _wait_until(
                lambda: effect_count(self.db_url) >= committed_count(self.db_url), scaled(120)
            ):
                self.summary.problems.append("not drained before the slot drop")
                return False
            dropped = drop_slot(self.db_url, scaled(30))
            if not _wait_for_slot(self.db_url, scaled(60)):
                self.summary.problems.append("no relay made the dropped slot again")
            return dropped
        finally:
            self.pause.unlink(missing_ok=True)


def _wait_until(condition, timeout: float, every: float = 0.2) -> bool:
    """Whether ``condition()`` held before ``timeout`` seconds were over."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(every)
    return True


def _wait_for_pause(producers: list, pause: Path, timeout: float) -> bool:
    """Wait until every producer still running says it started no transaction since ``pause``
    appeared."""
    first_keys = [index * KEYS_PER_PRODUCER for index in range(PRODUCERS)]

    def paused() -> bool:
        return all(
            producer.poll() is not None or pause.with_name(f"{pause.name}.{first}").exists()
            for producer, first in zip(producers, first_keys, strict=True)
        )

    return _wait_until(paused, timeout, every=0.05)


_SLOTS = "FROM pg_replication_slots WHERE database = current_database()"


def _wait_for_slot(db_url: str, timeout: float) -> bool:
    """Whether the run's database has a replication slot within ``timeout`` seconds."""
    return _wait_until(lambda: _count(db_url, text(f"SELECT count(*) {_SLOTS}")) > 0, timeout)


def drop_slot(db_url: str, timeout: float) -> bool:
    """Drop the run's replication slot, ending the walsender that holds it (the relays may take
    it again between the two: try until it is gone)."""
    engine = make_engine(db_url)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            try:
                with engine.begin() as conn:
                    conn.execute(
                        text(
                            f"SELECT pg_terminate_backend(active_pid) {_SLOTS}"
                            " AND active_pid IS NOT NULL"
                        )
                    )
                    dropped = conn.scalar(
                        text(f"SELECT count(pg_drop_replication_slot(slot_name)) {_SLOTS}")
                    )
                if dropped:
                    return True
            except DBAPIError:  # taken again in between: "replication slot ... is active"
                pass
            time.sleep(0.05)
        return False
    finally:
        engine.dispose()


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


class Operator:
    """The sequence variant's operator: fixes the bad steps written so far, then replays the
    dead letters of the run's events (``outboxkit dlq replay``, as a person would)."""

    def __init__(self, fleet: Fleet, workdir: Path, summary: Summary) -> None:
        self.fleet, self.summary = fleet, summary
        self.fixed = workdir / "fixed"
        self.log = workdir / "operator.log"
        self.last = time.monotonic()

    def maybe_replay(self, every: float = REPLAY_EVERY_S) -> None:
        """Replay if the last round is ``every`` seconds old."""
        if time.monotonic() - self.last >= every:
            self.replay()

    def replay(self) -> None:
        """Fix the bad steps written until now, then replay every letter not replayed yet
        (the letters of a step dead-lettered again before its fix are new letters: replayed
        next round). A round that fails (a broker restart) is tried again next time."""
        self.last = time.monotonic()
        staged = self.fixed.with_suffix(".new")
        staged.write_text(repr(time.time()))
        staged.replace(self.fixed)  # the handlers never read half a file
        args = ["dlq", "replay", f"{self.fleet.topic}.dlq", "--source", "/chaos", "--json"]
        args += ["--db-url", self.fleet.db_url, "--bootstrap", self.fleet.bootstrap]
        done = cli_process(*args, timeout=120)
        with open(self.log, "a") as log:
            log.write(done.err)
        self.summary.replay_rounds += 1
        if done.code == 0:
            self.summary.letters_replayed += int(done.json()["replayed"])


def _wait_for_effects(
    db_url: str, timeout: float, summary: Summary, operator: Operator | None = None
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        committed, applied = committed_count(db_url), effect_count(db_url)
        if committed and applied >= committed:
            return
        if operator is not None:
            operator.maybe_replay(every=5.0)
        time.sleep(0.5)
    summary.problems.append(
        f"not drained after {timeout:.0f}s: {effect_count(db_url)} effects "
        f"for {committed_count(db_url)} committed events"
    )


def _wait_for_empty_outbox(db_url: str, mode: str, timeout: float, summary: Summary) -> None:
    """Wait until the outbox holds no unpublished row (in logical mode: no row at all)."""
    rows = select(func.count()).select_from(outbox_events)
    if mode != "logical":
        rows = rows.where(outbox_events.c.published_ms.is_(None))
    if not _wait_until(lambda: _count(db_url, rows) == 0, timeout, every=0.5):
        summary.outbox_rows_left = _count(db_url, rows)
        summary.problems.append(f"{summary.outbox_rows_left} rows left in the outbox table")


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
    summary.duplicate_effects = len(applied_ids) - len(set(applied_ids))
    if summary.duplicate_effects:
        summary.problems.append(f"{summary.duplicate_effects} effects applied twice")
    summary.lost_events = len(set(committed_ids) - set(applied_ids))
    if summary.lost_events:
        summary.problems.append(f"{summary.lost_events} committed events never applied")
    if set(applied_ids) - set(committed_ids):
        summary.problems.append("an effect of no committed event")
    if rolled_back & (set(committed_ids) | set(applied_ids)):
        summary.problems.append("an event of a rolled-back transaction was written or applied")
    outbox_order: defaultdict[bytes, list[str]] = defaultdict(list)
    for row in outbox_rows:
        outbox_order[row.kafka_key.decode()].append(row.event_id)
    effect_order: defaultdict[str, list[str]] = defaultdict(list)
    for row in effects:
        effect_order[row.key].append(row.event_id)
    broken = [key for key in outbox_order if outbox_order[key] != effect_order.get(key)]
    summary.keys_out_of_order = len(broken)
    if broken:
        summary.problems.append(f"effects out of outbox order for keys {broken[:5]}")
    records = asyncio.run(
        read_topic(
            bootstrap,
            topic,
            expected=len(committed_ids),
            timeout=scaled(max(120, len(committed_ids) / 2000)),
        )
    )
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
        # Every process's log, the killed ones' too (their counters die with them).
        summary.event_keys_blocked += len(re.findall(r"key key-\d+ of \S+ blocked for", text))
        summary.key_releases += len(re.findall(r"key of \S+ released for consumer", text))
        summary.handler_timeouts += len(re.findall(r"handler \S+ timed out after", text))
    summary.handler_hangs = int((workdir / "hang").exists())
    if not summary.handler_hangs:
        summary.problems.append("the handler meant to hang once never did")


def _check_sequences(db_url: str, summary: Summary) -> None:
    """Once everything committed is applied, no key of the run's events is blocked and no
    record is held (the poison records' own keys stay blocked: nothing can apply them)."""
    poison_keys = {key_hash(poison_record(n)[0]) for n in range(summary.poison_records)}
    engine = make_engine(db_url)
    with engine.connect() as conn:
        blocked = conn.scalars(
            select(consumer_sequences.c.key_hash).where(consumer_sequences.c.state == "blocked")
        ).all()
        summary.records_held_at_end = conn.scalar(
            select(func.count()).select_from(consumer_held_events)
        )
    engine.dispose()
    summary.keys_blocked_at_end = len(blocked)
    if set(blocked) - poison_keys:
        summary.problems.append(f"{len(set(blocked) - poison_keys)} event keys still blocked")
    if summary.records_held_at_end:
        summary.problems.append(f"{summary.records_held_at_end} records still held")
    if not summary.letters_replayed:
        summary.problems.append("no bad step was dead-lettered and replayed")


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
    parser.add_argument("--mode", choices=["poll", "logical"], default="poll")
    parser.add_argument("--wal-messages", action="store_true", help="logical mode only")
    parser.add_argument("--sequence", action="store_true", help='on_dead_letter="sequence"')
    parser.add_argument("--relay-kills", type=int, default=10, help="at least")
    parser.add_argument("--consumer-kills", type=int, default=10, help="at least")
    parser.add_argument("--broker-restarts", type=int, default=1)
    parser.add_argument("--database-cuts", type=int, default=1)
    parser.add_argument("--slot-drops", type=int, default=0, help="logical mode only")
    parser.add_argument("--cluster", action="store_true", help="a three-node Kafka cluster")
    parser.add_argument("--leader-kills", type=int, default=None, help="--cluster (default 3)")
    parser.add_argument("--freezes", type=int, default=None, help="--cluster (default 2)")
    parser.add_argument("--rolling-restarts", type=int, default=None, help="--cluster (default 1)")
    parser.add_argument("--drain-timeout", type=float, default=3600.0, help="seconds")
    parser.add_argument("--workdir", type=Path, help="for the logs (default: a new temp dir)")
    args = parser.parse_args()
    if args.mode != "logical" and (args.wal_messages or args.slot_drops):
        parser.error("--wal-messages and --slot-drops need --mode logical")
    if min(args.events, args.relay_kills, args.consumer_kills, args.broker_restarts) < 0:
        parser.error("counts must not be negative")
    if min(args.database_cuts, args.slot_drops) < 0:
        parser.error("counts must not be negative")
    cluster_faults = (args.leader_kills, args.freezes, args.rolling_restarts)
    if not args.cluster and any(count is not None for count in cluster_faults):
        parser.error("--leader-kills, --freezes and --rolling-restarts need --cluster")
    leader_kills, freezes, rolling = (
        (3 if args.leader_kills is None else args.leader_kills),
        (2 if args.freezes is None else args.freezes),
        (1 if args.rolling_restarts is None else args.rolling_restarts),
    )
    if not args.cluster:
        leader_kills = freezes = rolling = 0
    if min(leader_kills, freezes, rolling) < 0:
        parser.error("counts must not be negative")
    faults = Faults(
        args.relay_kills,
        args.consumer_kills,
        args.broker_restarts,
        args.database_cuts,
        args.slot_drops,
        leader_kills,
        freezes,
        rolling,
    )
    if args.workdir:
        args.workdir.mkdir(parents=True, exist_ok=True)
    summary = run_chaos(
        args.events,
        args.seed,
        faults,
        args.workdir,
        args.drain_timeout,
        args.mode,
        args.wal_messages,
        args.sequence,
        args.cluster,
    )
    for name, value in asdict(summary).items():
        print(f"{name:45} {value}")
    sys.exit(1 if summary.problems else 0)


if __name__ == "__main__":
    main()
