"""The leak hunt: canaries planted through what users control, searched for everywhere.

Distinct canaries go in through event data and an event extension (a ``ce_authtoken``
header), a consumer handler's exception, workflow input
(secret fields in several spellings and a definition's ``redact_keys`` field), a workflow
handler's exception, an observation's answer, a signal's data, agent-action parameters and
results and a provider's exception, an HTTP request's body and headers (``Authorization``
and a body behind the Idempotency-Key middleware), the PostgreSQL password (in the database URL
of a ``--config`` TOML file) and a Kafka SASL password (in another config file).

Real processes run on them, all at once: ``outboxkit relay``, ``outboxkit consume`` and
``outboxkit workflows run`` (each serving ``/metrics``, exporting its spans to a file, logging
JSON lines) and the HTTP app under uvicorn; then ``status``, ``dlq show``, ``actions list`` and
``show``, ``workflows list`` and ``show`` in text and ``--json`` (in-process: the same CLI
code). Every table, topic, log line, CLI output, metric and span is searched: a canary may
appear only where docs/operations.md ("What never leaves the process") says user data is held
(:data:`ALLOWED`); a secret canary of a credential nowhere at all.

The self-check removes redactions (``tests/support/leak_sabotage.py``) and requires the hunt
to find what each hides: all of them at once by default, one run per redaction with
``OUTBOXKIT_TEST_LEAK_EACH=1``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from outboxkit.actions import ActionOutcomeUnknownError, Actions, ActionStore, operation_key
from outboxkit.outbox import Outbox, new_event
from outboxkit.outbox.tables import outbox_events
from outboxkit.testing.kafka import free_port
from outboxkit.workflows import WorkflowEngine, sign
from sqlalchemy import MetaData, create_engine, func, select, text
from sqlalchemy.engine import make_url

from tests.support import leak_app, leak_sabotage
from tests.support.actions import sessions_for
from tests.support.kafka import read_topic, wait_for
from tests.support.leak_sabotage import POINTS
from tests.support.ops import cli
from tests.support.waits import scaled

pytestmark = pytest.mark.integration

T = "acme"
CLI = ("-m", "tests.support.traced_cli")

# Where each canary may be: docs/operations.md, "What never leaves the process" (the places
# that hold user data). A canary not named here may appear nowhere.
EVENT_DATA = frozenset({"table outbox_events", "topic events", "topic dead letters"})
ALLOWED: dict[str, frozenset[str]] = {
    "event_secret": EVENT_DATA,
    "event_token": EVENT_DATA,
    "event_field": EVENT_DATA | {"output dlq show", "output dlq show --json"},
    "api_key": frozenset({"table workflow_instances"}),
    "private_key": frozenset({"table workflow_instances"}),
    "passphrase": frozenset({"table workflow_instances"}),
    "personal": frozenset({"table workflow_instances"}),
    "workflow_input": frozenset(
        {"table workflow_instances", "table workflow_history", "topic workflow events",
         "output workflows show --json", "output workflows show ok --json"}
    ),
    "observation": frozenset(
        {"table workflow_history", "topic workflow events", "output workflows show ok --json"}
    ),
    "signal_field": frozenset(
        {"table workflow_instances", "table workflow_signals", "table workflow_history",
         "topic workflow events", "output workflows show ok --json"}
    ),
    "action_result": frozenset(
        {"table agent_operations", "output actions show", "output actions show --json",
         "output actions list --json"}
    ),
    "action_result_secret": frozenset({"table agent_operations"}),
    "http_note": frozenset(
        {"table outbox_events", "topic events", "table http_idempotency_keys"}
    ),
}  # fmt: skip


def _canary(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def pg_role(pg_url: str) -> Iterator[tuple[str, str]]:
    """A login role with a canary password, and ``pg_url`` as that role."""
    role, password = f"leak_{uuid.uuid4().hex[:8]}", _canary("PGPASS")
    admin = create_engine(pg_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f"CREATE ROLE {role} LOGIN SUPERUSER PASSWORD '{password}'"))
    url = make_url(pg_url).set(username=role, password=password)
    try:
        yield url.render_as_string(hide_password=False), password
    finally:
        with admin.connect() as connection:
            connection.execute(text(f"DROP ROLE IF EXISTS {role}"))
        admin.dispose()


def leaks(
    canaries: dict[str, str], places: dict[str, str], allowed: dict[str, frozenset[str]]
) -> set[tuple[str, str]]:
    """Every ``(canary, place)`` where a canary is found outside the places it may be."""
    return {
        (canary, place)
        for canary, value in canaries.items()
        for place, content in places.items()
        if value in content and place not in allowed.get(canary, frozenset())
    }


def _tables(url: str) -> dict[str, str]:
    """Every table of the database (reflected: the migrations' and any other), its rows."""
    engine = create_engine(url)
    try:
        found = MetaData()
        found.reflect(engine)
        with engine.connect() as connection:
            return {
                table.name: repr(connection.execute(select(table)).all())
                for table in found.sorted_tables
            }
    finally:
        engine.dispose()


def _unpublished(url: str) -> int:
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            query = select(func.count()).where(  # a timer's row is not due for an hour
                outbox_events.c.published_ms.is_(None), outbox_events.c.deliver_at_ms.is_(None)
            )
            return int(connection.scalar(query.select_from(outbox_events)) or 0)
    finally:
        engine.dispose()


def _records(records: list[Any]) -> str:
    return repr([(r.key, r.value, r.headers) for r in records])


class Processes:
    """The long-running processes of the hunt, their output files, stopped together."""

    def __init__(self, folder: Path, env: dict[str, str]) -> None:
        self.folder, self.env = folder, env
        self.running: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, *argv: str, spans: bool = True) -> None:
        extra = {"LEAK_SPANS_FILE": str(self.folder / f"{name}.spans")} if spans else {}
        with open(self.folder / f"{name}.log", "wb") as log:  # the child keeps its own copy
            self.running[name] = subprocess.Popen(
                [sys.executable, *argv], env={**self.env, **extra}, stdout=log, stderr=log
            )

    def check(self) -> None:
        for name, process in self.running.items():
            if process.poll() is not None:
                raise AssertionError(f"{name} exited with {process.returncode}: {self.log(name)}")

    def log(self, name: str) -> str:
        return (self.folder / f"{name}.log").read_text(errors="replace")

    def spans(self, name: str) -> str:
        path = self.folder / f"{name}.spans"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> dict[str, int | None]:
        for process in self.running.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        codes: dict[str, int | None] = {}
        for name, process in self.running.items():
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=scaled(30))
            if process.poll() is None:
                process.kill()
                process.wait()
            codes[name] = process.returncode
        return codes


def _metrics(port: int) -> str:
    return httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text


async def _workflows(engine: WorkflowEngine, sessions: Any, done: dict[str, str]) -> bool:
    async with sessions() as session:
        for workflow_id, state in done.items():
            record = await engine.get(session, T, workflow_id)
            if record is None or record.state != state or (state == "intake" and not record.wait):
                return False
    return True


@dataclass
class Hunt:
    """What one run of the hunt planted and where it looked."""

    canaries: dict[str, str]
    places: dict[str, str]
    outputs: dict[str, str]
    tables: dict[str, str]
    metrics: dict[str, str]

    def leaks(self) -> set[tuple[str, str]]:
        return leaks(self.canaries, self.places, ALLOWED)


async def test_canaries_appear_only_where_user_data_is_held(
    pg_role: tuple[str, str],
    kafka_bootstrap: str,
    topic: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    hunt = await _hunt(pg_role, kafka_bootstrap, topic, tmp_path, monkeypatch, sabotage=[])
    assert hunt.leaks() == set()
    # the hunt looked where the canaries are meant to be, so it can see them
    canaries, places, outputs = hunt.canaries, hunt.places, hunt.outputs
    assert canaries["api_key"] in hunt.tables["workflow_instances"]
    for canary in ("event_secret", "http_note"):
        assert canaries[canary] in places["topic events"]
    assert canaries["observation"] in places["topic workflow events"]
    assert canaries["action_result"] in outputs["actions show"]
    assert "IllegalSaslStateError" in outputs["status secured"]
    assert "unreachable" in outputs["status secured"] and ":***@" in outputs["status secured"]
    for name in ("relay", "consume"):  # the worker writes events, traced by the relay
        assert '"trace_id"' in places[f"spans {name}"], name
    assert "outboxkit_relay" in hunt.metrics["relay"]
    assert "outboxkit_http_idempotency" in hunt.metrics["http"]
    assert json.loads(outputs["workflows show --json"])["summary"]["state"] == "human_review"


# What the hunt finds with each redaction removed (tests/support/leak_sabotage.py).
WITNESSES: dict[str, tuple[str, str]] = {
    "history redact": ("api_key", "table workflow_history"),
    "signal data redact": ("signal_token", "table workflow_signals"),
    "workflows show redact": ("api_key", "output workflows show --json"),
    "dlq show redact": ("event_secret", "output dlq show --json"),
    "dlq show header redact": ("event_token", "output dlq show"),
    "actions show redact": ("action_result_secret", "output actions show --json"),
    "redact_keys": ("personal", "table workflow_history"),
    "secret word privatekey": ("private_key", "table workflow_history"),
    "dead-letter describe_error": ("handler_error", "topic dead letters"),
    "actions describe_error": ("provider_error", "table agent_operations"),
    "workflow describe_error": ("workflow_error", "table workflow_instances"),
    "describe_error": ("workflow_error", "table workflow_history"),
    "database URL password": ("pg_password", "output status secured"),
}
EACH = os.environ.get("OUTBOXKIT_TEST_LEAK_EACH") == "1"


@pytest.mark.parametrize(
    "points", [list(POINTS), *([name] for name in POINTS if EACH)], ids=lambda p: "+".join(p)
)
async def test_the_hunt_sees_each_redaction_removed(
    points: list[str],
    pg_role: tuple[str, str],
    kafka_bootstrap: str,
    topic: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With redactions removed the hunt finds what each one hides (all at once here; one at a
    time with ``OUTBOXKIT_TEST_LEAK_EACH=1``)."""
    hunt = await _hunt(pg_role, kafka_bootstrap, topic, tmp_path, monkeypatch, sabotage=points)
    found = hunt.leaks()
    assert {WITNESSES[name] for name in points} <= found, found


async def _hunt(
    pg_role: tuple[str, str],
    kafka_bootstrap: str,
    topic: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    *,
    sabotage: list[str],
) -> Hunt:
    """Plant the canaries, run every process on them, and gather every place to search."""
    url, pg_password = pg_role
    canaries = {
        "event_secret": _canary("EVPASS"),
        "event_field": _canary("EVNOTE"),
        "event_token": _canary("EVTOKEN"),
        "handler_error": _canary("HANDLERERR"),
        "api_key": _canary("APIKEY"),
        "private_key": _canary("PRIVKEY"),
        "passphrase": _canary("PASSPHRASE"),
        "personal": _canary("PERSONAL"),
        "workflow_input": _canary("WFNOTE"),
        "workflow_error": _canary("WFERR"),
        "observation": _canary("OBSNOTE"),
        "observation_secret": _canary("OBSTOKEN"),
        "signal_token": _canary("SIGTOKEN"),
        "signal_field": _canary("SIGNOTE"),
        "action_param": _canary("ACTNOTE"),
        "action_card": _canary("ACTCARD"),
        "action_result": _canary("ACTRESULT"),
        "action_result_secret": _canary("ACTRESKEY"),
        "provider_error": _canary("PROVIDERERR"),
        "http_note": _canary("HTTPNOTE"),
        "http_secret": _canary("HTTPPASS"),
        "http_bearer": _canary("BEARER"),
        "pg_password": pg_password,
        "sasl_password": _canary("SASLPASS"),
    }
    config = tmp_path / "outboxkit.toml"
    config.write_text(f'[database]\nurl = "{url}"\n[kafka]\nbootstrap = "{kafka_bootstrap}"\n')
    secured = tmp_path / "secured.toml"  # a database nothing listens on, a SASL broker
    closed = make_url(url).set(port=free_port()).render_as_string(hide_password=False)
    secured.write_text(
        f'[database]\nurl = "{closed}"\n[kafka]\nbootstrap = "{kafka_bootstrap}"\n'
        'security_protocol = "SASL_PLAINTEXT"\nsasl_mechanism = "SCRAM-SHA-512"\n'
        f'sasl_username = "leak"\nsasl_password = "{canaries["sasl_password"]}"\n'
    )
    for variable in ("OUTBOXKIT_DB_URL", "OUTBOXKIT_KAFKA_BOOTSTRAP"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("OUTBOXKIT_CONFIG", str(config))  # the processes' and the CLI's
    env = {
        **os.environ,
        "PYTHONPATH": os.getcwd(),
        "LEAK_TOPIC": topic,
        "LEAK_HANDLER_CANARY": canaries["handler_error"],
        "LEAK_WORKFLOW_CANARY": canaries["workflow_error"],
        "LEAK_OBSERVATION_CANARY": canaries["observation"],
        "LEAK_OBSERVATION_SECRET": canaries["observation_secret"],
        "LEAK_SABOTAGE": ",".join(sabotage),
    }
    leak_sabotage.apply(sabotage, monkeypatch.setattr)
    monkeypatch.setattr(leak_app, "ACTION_RESULT", canaries["action_result"])
    monkeypatch.setattr(leak_app, "ACTION_RESULT_SECRET", canaries["action_result_secret"])
    data = {"password": canaries["event_secret"], "note": canaries["event_field"]}
    event_extensions = {"authtoken": canaries["event_token"]}  # the ce_authtoken header
    workflow_input = {
        "apiKey": canaries["api_key"],
        "private_key": canaries["private_key"],
        "Pass-Phrase": canaries["passphrase"],
        "customer_name": canaries["personal"],
        "note": canaries["workflow_input"],
    }
    store = ActionStore(Outbox(default_topic=f"{topic}-actions"))
    async with sessions_for(url) as sessions:
        engine = leak_app.build_engine(sessions)
        async with sessions() as session, session.begin():
            order = new_event("leak.order", "shop", data, extensions=event_extensions)
            await Outbox().add_async(session, order, topic=topic)
            failing = {**workflow_input, "explode": True}
            await engine.start(session, "leak", "W-fail", failing, tenant=T)
            await engine.start(session, "leak", "W-ok", workflow_input, tenant=T)
        with Actions(sessions, tenant=T, run_id="leak-run", store=store):
            await leak_app.charge("O-1", canaries["action_card"], canaries["action_param"])
            with pytest.raises(ActionOutcomeUnknownError):
                await leak_app.refund("O-2", canaries["provider_error"])

        ports = {"relay": free_port(), "consume": free_port(), "worker": free_port()}
        http_port = free_port()
        processes = Processes(tmp_path, env)
        metrics: dict[str, str] = {}
        try:
            processes.start(
                "relay", *CLI, "relay", "--no-listen", "--poll-interval", "100ms",
                "--json-logs", "--metrics-port", str(ports["relay"]),
            )  # fmt: skip
            processes.start(
                "consume", *CLI, "consume", "tests.support.leak_app:app", "--json-logs",
                "--group", f"leak-{uuid.uuid4().hex[:6]}", "--metrics-port", str(ports["consume"]),
            )  # fmt: skip
            processes.start(
                "worker", *CLI, "workflows", "run", "tests.support.leak_app:build_engine",
                "--no-listen", "--poll-interval", "100ms", "--json-logs",
                "--metrics-port", str(ports["worker"]),
            )  # fmt: skip
            processes.start(
                "http", "-m", "uvicorn", "tests.support.leak_http:app", "--host", "127.0.0.1",
                "--port", str(http_port), "--no-access-log", spans=False,
            )  # fmt: skip

            async def answers() -> int:
                processes.check()
                try:
                    async with httpx.AsyncClient(timeout=5) as client:
                        return (
                            await client.get(f"http://127.0.0.1:{http_port}/health")
                        ).status_code
                except httpx.TransportError:
                    return 0

            await wait_for(answers, lambda status: status == 200, 60, "the HTTP app")
            headers = {
                "Authorization": f"Bearer {canaries['http_bearer']}",
                "Idempotency-Key": "order-1",
                "X-Tenant": T,
            }
            body = {"note": canaries["http_note"], "password": canaries["http_secret"]}
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{http_port}") as client:
                first = await client.post("/orders", json=body, headers=headers, timeout=30)
                again = await client.post("/orders", json=body, headers=headers, timeout=30)
                other = await client.post(
                    "/orders", json={**body, "note": "x"}, headers=headers, timeout=30
                )
            assert (first.status_code, again.status_code, other.status_code) == (201, 201, 422)
            assert again.headers["idempotent-replay"] == "true"
            metrics["http"] = _metrics(http_port)

            async def waiting() -> bool:
                processes.check()
                return await _workflows(
                    engine, sessions, {"W-fail": "human_review", "W-ok": "intake"}
                )

            await wait_for(waiting, bool, 60, "the worker to run both workflows")
            async with sessions() as session:
                record = await engine.get(session, T, "W-ok")
            assert record is not None and record.wait is not None
            extensions = {
                "workflowid": "W-ok", "tenantid": T, "correlationid": record.wait.correlation
            }  # fmt: skip
            signal_data = {"token": canaries["signal_token"], "note": canaries["signal_field"]}
            extensions["authsig"] = sign(
                leak_app.SIGNALS_KEY, source="leak-signals", id="s-1", type="leak.done",
                extensions=extensions, data=signal_data,
            )  # fmt: skip
            async with sessions() as session, session.begin():
                event = new_event(
                    "leak.done", "leak-signals", signal_data, id="s-1", extensions=extensions
                )
                taken = await engine.deliver(session, event)
            assert taken is not None and taken.outcome == "accepted"

            async def completed() -> bool:
                processes.check()
                return await _workflows(engine, sessions, {"W-ok": "complete"})

            await wait_for(completed, bool, 60, "the worker to complete W-ok")
            letters = await wait_for(
                lambda: read_topic(kafka_bootstrap, f"{topic}.dlq", 1, timeout=5),
                lambda records: len(records) >= 1,
                90,
                "the dead letter",
            )
            await wait_for(lambda: _unpublished(url), lambda n: n == 0, 60, "the relay to publish")
            for name, port in ports.items():
                metrics[name] = _metrics(port)
        finally:
            codes = processes.stop()
    # uvicorn re-raises the SIGTERM it handled, once shut down
    assert codes == {"relay": 0, "consume": 0, "worker": 0, "http": -signal.SIGTERM}, codes

    outputs = {f"{name} log": processes.log(name) for name in processes.running}
    key = operation_key(T, "leak-run", "leak.charge", "leak.charge", '["O-1"]', 1)
    failed_key = operation_key(T, "leak-run", "leak.refund", "leak.refund", '["O-2"]', 1)
    app = ("--app", "tests.support.leak_app:build_engine")  # its redact_keys
    for name, argv in {
        "status": ("status", "--json"),
        "status secured": ("--config", str(secured), "status", "--json"),
        "dlq show": ("dlq", "show", f"{topic}.dlq", "0"),
        "dlq show --json": ("dlq", "show", f"{topic}.dlq", "0", "--json"),
        "actions list": ("actions", "list", "--tenant", T),
        "actions list --json": ("actions", "list", "--tenant", T, "--json"),
        "actions show": ("actions", "show", key, "--tenant", T),
        "actions show --json": ("actions", "show", key, "--tenant", T, "--json"),
        "actions show failed": ("actions", "show", failed_key, "--tenant", T),
        "actions show failed --json": ("actions", "show", failed_key, "--tenant", T, "--json"),
        "workflows list": ("workflows", "list"),
        "workflows list --json": ("workflows", "list", "--json"),
        "workflows show": ("workflows", "show", T, "W-fail", *app),
        "workflows show --json": ("workflows", "show", T, "W-fail", "--json", *app),
        "workflows show ok": ("workflows", "show", T, "W-ok", *app),
        "workflows show ok --json": ("workflows", "show", T, "W-ok", "--json", *app),
    }.items():
        # in this process (the same CLI code, without sixteen interpreter start-ups)
        result = await cli(*argv)
        outputs[name] = result.out + result.err
    tables = _tables(url)
    event_topic = _records(await read_topic(kafka_bootstrap, topic, 1, timeout=10))
    places = {
        **{f"table {name}": rows for name, rows in tables.items()},
        **{f"output {name}": text_ for name, text_ in outputs.items()},
        **{f"metrics {name}": text_ for name, text_ in metrics.items()},
        **{f"spans {name}": processes.spans(name) for name in ports},
        "topic events": event_topic,
        "topic dead letters": _records(letters),
        "topic workflow events": _records(
            await read_topic(kafka_bootstrap, f"{topic}-wf", 1, timeout=10)
        ),
        "topic action events": _records(
            await read_topic(kafka_bootstrap, f"{topic}-actions", 1, timeout=10)
        ),
    }
    return Hunt(canaries, places, outputs, tables, metrics)
