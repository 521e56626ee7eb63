"""outboxkit against secured brokers: SASL_SSL with SCRAM-SHA-512, and mTLS.

One broker of each kind per module run (each start costs about ten seconds). On each: the relay
publishes, a consumer applies (and dead-letters a bad record through its secured producer),
``status`` and ``dlq replay`` work; a wrong password or an untrusted CA fails with one line
naming the cause and exit 2, and a long-running relay logs one line per failure class. Every
log line, metric, span and command output of those runs is searched for the secrets.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from outboxkit.consumers.runtime import ConsumerRuntime
from outboxkit.outbox import Outbox
from outboxkit.outbox.db import make_engine
from outboxkit.outbox.kafka_settings import KafkaSettings
from outboxkit.relay import Relay, RelayOptions
from outboxkit.testing.certificates import make_certificates
from outboxkit.testing.kafka import KafkaBroker, create_topic
from prometheus_client import REGISTRY, generate_latest
from pydantic import SecretStr
from sqlalchemy.orm import Session

from tests.support.consumer_apps import consumer_effects
from tests.support.consumers import (
    count_rows,
    create_effects_table,
    effects_app_for,
    produce,
    widget,
)
from tests.support.kafka import read_topic, wait_for
from tests.support.ops import CliResult, cli_process
from tests.support.waits import scaled

pytestmark = pytest.mark.integration

EVENTS = 20
FAST = RelayOptions(poll_interval_s=0.1, lease_ttl_s=5.0, request_timeout_s=2.0)


@pytest.fixture(scope="module", params=["sasl_ssl", "mtls"])
def secured(request: pytest.FixtureRequest) -> Iterator[KafkaBroker]:
    """A broker whose client listener is SASL_SSL (SCRAM-SHA-512) or mTLS, started once."""
    broker = KafkaBroker(security=request.param)
    broker.start()
    try:
        yield broker
    finally:
        broker.close()


@pytest.fixture
def secrets_seen(
    secured: KafkaBroker, caplog: pytest.LogCaptureFixture, span_exporter: InMemorySpanExporter
) -> Iterator[list[str]]:
    """Texts of this test to search for secrets: append command output; logs, metrics and
    spans are added at the end, then searched."""
    caplog.set_level(logging.DEBUG)
    span_exporter.clear()
    texts: list[str] = []
    yield texts
    texts.append(caplog.text)
    texts.append(generate_latest(REGISTRY).decode())
    for span in span_exporter.get_finished_spans():
        texts.append(f"{span.name} {dict(span.attributes or {})} {span.events}")
    secrets = secured.kafka.secrets()
    assert secrets, "the broker's client settings hold a secret"
    for secret in secrets:
        assert not any(secret in text for text in texts), "a secret reached a log/metric/span"


def env_of(kafka: KafkaSettings) -> dict[str, str]:
    """``OUTBOXKIT_KAFKA_*`` variables for ``kafka``: how an operator passes secrets."""
    env = {}
    for name, value in kafka.model_dump(exclude_none=True).items():
        if isinstance(value, SecretStr):
            value = value.get_secret_value()
        env[f"OUTBOXKIT_KAFKA_{name.upper()}"] = str(value)
    return env


def run_cli(monkeypatch: pytest.MonkeyPatch, kafka: KafkaSettings, *argv: str) -> CliResult:
    for name in [n for n in __import__("os").environ if n.startswith("OUTBOXKIT_KAFKA_")]:
        monkeypatch.delenv(name)
    for name, value in env_of(kafka).items():
        monkeypatch.setenv(name, value)
    return cli_process(*argv, timeout=120)


def write_widgets(url: str, topic: str, count: int) -> None:
    engine = make_engine(url)
    with Session(engine) as session, session.begin():
        for n in range(count):
            Outbox(default_topic=topic).add(session, widget(n))
    engine.dispose()


async def test_relay_consumer_status_and_replay_work_on_a_secured_broker(
    secured: KafkaBroker,
    pg_url: str,
    topic: str,
    monkeypatch: pytest.MonkeyPatch,
    secrets_seen: list[str],
) -> None:
    kafka = secured.kafka
    await create_topic(kafka, topic)
    await create_topic(kafka, f"{topic}.dlq")
    write_widgets(pg_url, topic, EVENTS)

    assert (
        await Relay(db_url=pg_url, kafka=kafka, options=FAST).drain(timeout_s=scaled(60)) == EVENTS
    )
    assert len(await read_topic(kafka, topic, expected=EVENTS)) == EVENTS

    bad_record = (b"k", b'{"n": ', [("ce_specversion", b"1.0"), ("ce_id", b"bad-1"),
                  ("ce_source", b"/widgets"), ("ce_type", b"widget.created"),
                  ("content-type", b"application/json")])  # fmt: skip
    await produce(kafka, topic, [bad_record])
    create_effects_table(pg_url)
    group = f"secured-{uuid.uuid4().hex[:8]}"
    runtime = ConsumerRuntime(effects_app_for(topic), kafka=kafka, db_url=pg_url, group=group)
    async with runtime:
        await wait_for(
            lambda: (runtime.stats.applied, runtime.stats.dead_lettered),
            lambda seen: seen[0] >= EVENTS and seen[1] >= 1,
            60,
            "every widget applied and the bad record dead-lettered",
        )
    assert count_rows(pg_url, consumer_effects) == EVENTS
    assert len(await read_topic(kafka, f"{topic}.dlq", expected=1)) == 1

    status = run_cli(monkeypatch, kafka, "status", "--db-url", pg_url, "--group", group, "--json")
    secrets_seen += [status.out, status.err]
    assert status.code == 0, status.err
    assert status.json()["consumers"]["groups"][0]["total_lag"] == 0

    replay = run_cli(
        monkeypatch, kafka, "dlq", "replay", f"{topic}.dlq", "--db-url", pg_url, "--json"
    )
    secrets_seen += [replay.out, replay.err]
    assert replay.code == 0, replay.err
    assert replay.json()["replayed"] == 1
    assert len(await read_topic(kafka, topic, expected=EVENTS + 2)) == EVENTS + 2


def wrong_settings(broker: KafkaBroker, what: str, tmp_path: Path) -> tuple[KafkaSettings, str]:
    """The broker's settings with one thing wrong, and the cause the error must name."""
    if what == "password":
        if broker.security != "sasl_ssl":
            pytest.skip("no password on an mTLS broker")
        wrong = SecretStr(f"wrong-{uuid.uuid4().hex}")
        return broker.kafka.model_copy(
            update={"sasl_password": wrong}
        ), "SASL authentication failed"
    other_ca = make_certificates(tmp_path / "other").ca_file
    return broker.kafka.model_copy(update={"ssl_cafile": other_ca}), "certificate verify failed"


@pytest.mark.parametrize("what", ["password", "ca"])
def test_a_wrong_password_or_ca_fails_with_one_line_naming_the_cause_and_exit_2(
    secured: KafkaBroker,
    what: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    secrets_seen: list[str],
) -> None:
    wrong, cause = wrong_settings(secured, what, tmp_path)
    result = run_cli(monkeypatch, wrong, "dlq", "list", "orders.dlq", "--timeout", "5")
    secrets_seen += [result.out, result.err]
    assert result.code == 2
    line = result.error_line()
    assert cause in line and secured.bootstrap in line
    for secret in wrong.secrets():
        assert secret not in result.err + result.out


@pytest.mark.parametrize("what", ["password", "ca"])
async def test_a_running_relay_retries_and_logs_one_line_per_failure_class(
    secured: KafkaBroker,
    what: str,
    sqlite_url: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    secrets_seen: list[str],
) -> None:
    wrong, cause = wrong_settings(secured, what, tmp_path)
    relay = Relay(db_url=sqlite_url, kafka=wrong, options=FAST)
    async with relay:
        await wait_for(lambda: relay.kafka.failures, lambda n: n >= 3, 30, "three failed attempts")
        assert relay.running
    lines = [
        record.getMessage()
        for record in caplog.records
        if record.name == "outboxkit.relay" and "kafka unavailable" in record.getMessage()
    ]
    assert len(lines) == 1 and cause in lines[0], lines
    for secret in wrong.secrets():
        assert secret not in caplog.text
