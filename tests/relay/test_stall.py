"""The stall detector on real relay processes, PostgreSQL and Kafka (docs/observability.md#stalls):
a relay stopped with SIGSTOP (not killed: its lease still looks held) turns ``outboxkit status``
to exit 1 within the stall time and not before; a relay alive whose Kafka is unreachable says
so with ``/readyz`` 503 naming the stall, one log line when it starts and one when it clears;
and neither fires while events flow."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from outboxkit.outbox import Outbox, new_event
from outboxkit.outbox.db import make_engine
from outboxkit.outbox.kafka_settings import KafkaSettings
from outboxkit.relay import Relay, RelayOptions
from outboxkit.testing.kafka import KafkaBroker, KafkaLauncherError, free_port
from outboxkit.testing.processes import start_cli, terminate
from sqlalchemy.orm import Session

from tests.outbox.test_probes import get
from tests.relay.test_processes import published_count
from tests.relay.test_processes import relay_args as process_args
from tests.support.kafka import broker_of_its_own, wait_for
from tests.support.ops import CliResult, cli
from tests.support.waits import scaled

STALL_S = 5.0


@pytest.fixture(scope="module")
def stoppable_kafka() -> Iterator[KafkaBroker]:
    """A broker of this module's own, which its tests stop and start again (one start for all)."""
    with broker_of_its_own() as broker:
        yield broker


def running_again(broker: KafkaBroker) -> None:
    """Start ``broker`` unless it runs: the next test needs it whatever this one did."""
    with contextlib.suppress(KafkaLauncherError):
        broker.start()


def relay_args(db_url: str, bootstrap: str, port: int) -> list[str]:
    # A lease longer than the stall time: a stopped relay still holds its shards when the
    # stall is due, so status must see it from the relay's own record, not a free shard.
    # (The later --lease-ttl and --request-timeout win over those of the common arguments.)
    return process_args(
        db_url,
        bootstrap,
        *("--lease-ttl", "20", "--request-timeout", "2"),
        *("--stall-after", f"{STALL_S:g}s", "--metrics-port", str(port)),
    )


@contextlib.contextmanager
def events_flowing(url: str, topic: str, every_s: float = 0.05) -> Iterator[list[int]]:
    """Write one event every ``every_s`` in a thread until the block ends; yields the count."""
    written = [0]
    done = threading.Event()

    def write() -> None:
        engine = make_engine(url)
        outbox = Outbox(default_topic=topic)
        try:
            while not done.wait(every_s):
                with Session(engine) as session, session.begin():
                    outbox.add(session, new_event("tick", "/stall", {"n": written[0]}))
                written[0] += 1
        finally:
            engine.dispose()

    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    try:
        yield written
    finally:
        done.set()
        thread.join(30)


async def status(pg_url: str, bootstrap: str) -> CliResult:
    return await cli(
        "status", "--db-url", pg_url, "--bootstrap", bootstrap, "--max-stall", f"{STALL_S:g}s"
    )


async def readyz(port: int) -> tuple[int, dict[str, object]]:
    code, body = await asyncio.to_thread(get, port, "/readyz")
    return code, json.loads(body) if code in (200, 503) else {}


async def no_alarm_while_flowing(pg_url: str, bootstrap: str, port: int) -> None:
    """Two stall times of events flowing: status exits 0 and /readyz is 200 throughout."""
    until = time.monotonic() + 2 * STALL_S
    before = published_count(pg_url)
    checks = 0
    while time.monotonic() < until or checks < 3:
        result = await status(pg_url, bootstrap)
        assert result.code == 0, result.err
        assert (await readyz(port))[0] == 200
        checks += 1
        await asyncio.sleep(0.5)
    assert published_count(pg_url) > before + 50, "events flowed meanwhile"


async def test_a_stopped_relay_turns_status_to_exit_1_within_the_stall_time(
    pg_url: str, kafka_bootstrap: str, topic: str, tmp_path: Path
) -> None:
    port = free_port()
    relay = start_cli(relay_args(pg_url, kafka_bootstrap, port), tmp_path / "relay.log")
    try:
        with events_flowing(pg_url, topic):
            await wait_for(lambda: readyz(port), lambda r: r[0] == 200, 60, "relay ready")
            await no_alarm_while_flowing(pg_url, kafka_bootstrap, port)
            os.kill(relay.pid, signal.SIGSTOP)
            stopped_at = time.monotonic()
            result = await wait_for(
                lambda: status(pg_url, kafka_bootstrap),
                lambda r: r.code != 0,
                STALL_S + 10,
                "status to exit 1",
            )
            elapsed = time.monotonic() - stopped_at
        assert result.code == 1, result.err
        # Its lease (20 s) still holds: the relay is named, from its own record.
        assert f"threshold crossed: relay {relay_id_of(result)} is stalled" in result.err
        assert STALL_S <= elapsed <= STALL_S + scaled(4), elapsed
        # A stopped process answers no probe at all (Kubernetes counts that as a failure).
        assert (await readyz(port))[0] == 0
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(relay.pid, signal.SIGCONT)
        terminate(relay)


def relay_id_of(result: CliResult) -> str:
    for line in result.err.splitlines():
        if "relay " in line and " is stalled" in line:
            return line.split("relay ", 1)[1].split(" is stalled", 1)[0]
    raise AssertionError(result.err)


async def test_a_relay_alive_without_kafka_says_it_is_stalled_and_clears(
    pg_url: str, kafka_bootstrap: str, stoppable_kafka: KafkaBroker, topic: str, tmp_path: Path
) -> None:
    port = free_port()
    log = tmp_path / "relay.log"
    relay = start_cli(relay_args(pg_url, stoppable_kafka.bootstrap, port), log)
    try:
        with events_flowing(pg_url, topic):
            await wait_for(lambda: readyz(port), lambda r: r[0] == 200, 60, "relay ready")
            # (quiet while events flow: the test above) events flow before Kafka goes
            await wait_for(lambda: published_count(pg_url), lambda n: n > 20, 60, "events flowing")
            stopped_at = time.monotonic()  # before: the broker refuses while it shuts down
            stoppable_kafka.stop()
            code, body = await wait_for(
                lambda: readyz(port),
                lambda r: "stalled" in r[1].get("not_ready", {}),  # type: ignore[operator]
                STALL_S + 10,
                "/readyz naming the stall",
            )
            elapsed = time.monotonic() - stopped_at
            assert code == 503
            assert "nothing was published" in body["not_ready"]["stalled"]  # type: ignore[index]
            assert STALL_S <= elapsed <= STALL_S + scaled(4), elapsed
            result = await status(pg_url, kafka_bootstrap)  # status reads the other broker
            assert result.code == 1 and " is stalled" in result.err, result.err
            stoppable_kafka.start()
            await wait_for(lambda: readyz(port), lambda r: r[0] == 200, 60, "ready again")
        text = log.read_text()
        assert text.count("stalled: the oldest due row") == 1, text[-3000:]
        assert text.count("stalled cleared after") == 1, text[-3000:]
    finally:
        terminate(relay)
        running_again(stoppable_kafka)


SLOT_LAG_LIMIT = 4 * 1024 * 1024
INACTIVE_S = 4.0


def write_big_events(url: str, topic: str, count: int, size: int = 8192) -> None:
    """``count`` events of ``size`` random bytes each: WAL the slot must pass (not compressed)."""
    engine = make_engine(url)
    outbox = Outbox(default_topic=topic)
    with Session(engine) as session, session.begin():
        for n in range(count):
            outbox.add(
                session, new_event("big", "/stall", {"n": n, "blob": os.urandom(size).hex()})
            )
    engine.dispose()


async def slot_status(pg_url: str, bootstrap: str) -> CliResult:
    return await cli(
        "status",
        "--db-url",
        pg_url,
        "--bootstrap",
        bootstrap,
        "--max-slot-lag-bytes",
        str(SLOT_LAG_LIMIT),
        "--max-slot-inactive",
        f"{INACTIVE_S:g}s",
    )


async def test_a_lagging_then_inactive_slot_is_named_and_a_streaming_one_is_not(
    pg_url: str, kafka_bootstrap: str, stoppable_kafka: KafkaBroker, topic: str
) -> None:
    options = RelayOptions(
        mode="logical",
        lease_ttl_s=3,
        request_timeout_s=1.5,
        poll_interval_s=0.2,
        max_slot_lag_bytes=SLOT_LAG_LIMIT,
    )
    relay = Relay(
        db_url=pg_url, kafka=KafkaSettings(bootstrap=stoppable_kafka.bootstrap), options=options
    )

    def problems() -> dict[str, str]:
        return dict(relay.readiness.ready()[1].get("not_ready", {}))

    try:
        async with relay:
            with events_flowing(pg_url, topic):
                await wait_for(problems, lambda p: not p, 60, "the relay ready")
                until = time.monotonic() + 2 * INACTIVE_S
                while time.monotonic() < until:  # streaming while events flow: no alarm
                    assert "slot" not in problems()
                    result = await slot_status(pg_url, kafka_bootstrap)
                    assert result.code == 0, result.err
                    await asyncio.sleep(0.5)
                stoppable_kafka.stop()  # nothing is confirmed any more: the slot falls behind
                await asyncio.to_thread(write_big_events, pg_url, topic, 1000)
                found = await wait_for(
                    problems, lambda p: "slot" in p, 30, "/readyz naming the slot"
                )
                assert "lags" in found["slot"] and f"(limit {SLOT_LAG_LIMIT})" in found["slot"]
                result = await slot_status(pg_url, kafka_bootstrap)
                assert result.code == 1 and f"--max-slot-lag-bytes {SLOT_LAG_LIMIT}" in result.err
                stoppable_kafka.start()
                await wait_for(problems, lambda p: "slot" not in p, 90, "the slot caught up")
    finally:
        running_again(stoppable_kafka)
    # No relay streams the slot any more: once an insert waits INACTIVE_S, status says so.
    with events_flowing(pg_url, topic):
        stopped_at = time.monotonic()
        result = await wait_for(
            lambda: slot_status(pg_url, kafka_bootstrap),
            lambda r: "is inactive" in r.err,
            INACTIVE_S + 10,
            "status naming the inactive slot",
        )
        elapsed = time.monotonic() - stopped_at
    assert result.code == 1 and f"(--max-slot-inactive {INACTIVE_S:g})" in result.err
    assert INACTIVE_S <= elapsed <= INACTIVE_S + scaled(4), elapsed
