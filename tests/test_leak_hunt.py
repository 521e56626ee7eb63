"""The leak hunt: canaries planted through what users control, searched for everywhere.

Distinct canaries go in through event data, a consumer handler's exception, workflow input
(secret fields in several spellings and a definition's ``redact_keys`` field), a workflow
handler's exception, a signal's data and the PostgreSQL password. Real processes then run on
them (``outboxkit relay`` and ``outboxkit consume`` as processes; ``status``, ``dlq show``,
``workflows list`` and ``show`` in text and ``--json`` in-process), and every table, topic, log
line and CLI output is searched: a canary may appear only where docs/operations.md ("What never
leaves the process") says user data is held.
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
from typing import Any

import pytest
from outboxkit.outbox import Outbox, new_event
from outboxkit.outbox.tables import metadata
from outboxkit.workflows import sign
from sqlalchemy import create_engine, select, text
from sqlalchemy.engine import make_url

from tests.support import leak_app
from tests.support.actions import sessions_for
from tests.support.kafka import read_topic, wait_for
from tests.support.ops import CliResult, cli

T = "acme"


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


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.getcwd(), **extra}


def _cli(env: dict[str, str], *argv: str) -> CliResult:
    done = subprocess.run(
        [sys.executable, "-c", "from outboxkit.cli.main import main; main()", *argv],
        capture_output=True,
        text=True,
        timeout=90,
        env=env,
        check=False,
    )
    return CliResult(done.returncode, done.stdout, done.stderr, 0.0)


def _tables(url: str) -> dict[str, str]:
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            return {
                table.name: repr(connection.execute(select(table)).all())
                for table in metadata.sorted_tables
            }
    finally:
        engine.dispose()


def _records(records: list[Any]) -> str:
    return repr([(r.key, r.value, r.headers) for r in records])


async def test_canaries_appear_only_where_user_data_is_held(
    pg_role: tuple[str, str], kafka_bootstrap: str, topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, pg_password = pg_role
    canaries = {
        "event_secret": _canary("EVPASS"),
        "event_field": _canary("EVNOTE"),
        "handler_error": _canary("HANDLERERR"),
        "api_key": _canary("APIKEY"),
        "private_key": _canary("PRIVKEY"),
        "passphrase": _canary("PASSPHRASE"),
        "personal": _canary("PERSONAL"),
        "workflow_input": _canary("WFNOTE"),
        "workflow_error": _canary("WFERR"),
        "signal_token": _canary("SIGTOKEN"),
        "signal_field": _canary("SIGNOTE"),
        "pg_password": pg_password,
    }
    env = _env(
        LEAK_TOPIC=topic,
        LEAK_HANDLER_CANARY=canaries["handler_error"],
        LEAK_WORKFLOW_CANARY=canaries["workflow_error"],
        OUTBOXKIT_DB_URL=url,
        OUTBOXKIT_KAFKA_BOOTSTRAP=kafka_bootstrap,
    )
    monkeypatch.setattr(leak_app, "WORKFLOW_CANARY", canaries["workflow_error"])
    data = {"password": canaries["event_secret"], "note": canaries["event_field"]}
    workflow_input = {
        "apiKey": canaries["api_key"],
        "private_key": canaries["private_key"],
        "Pass-Phrase": canaries["passphrase"],
        "customer_name": canaries["personal"],
        "note": canaries["workflow_input"],
    }
    async with sessions_for(url) as sessions:
        engine = leak_app.build_engine(sessions)
        async with sessions() as session, session.begin():
            await Outbox().add_async(session, new_event("leak.order", "shop", data), topic=topic)
            failing = {**workflow_input, "explode": True}
            await engine.start(session, "leak", "W-fail", failing, tenant=T)
            await engine.start(session, "leak", "W-ok", workflow_input, tenant=T)
        for _ in range(5):
            await engine.run_due()
        async with sessions() as session:
            waiting = await engine.get(session, T, "W-ok")
        assert waiting is not None and waiting.wait is not None
        correlation = waiting.wait.correlation
        extensions = {"workflowid": "W-ok", "tenantid": T, "correlationid": correlation}
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
        for _ in range(5):
            await engine.run_due()
        async with sessions() as session:
            failed = await engine.get(session, T, "W-fail")
            done = await engine.get(session, T, "W-ok")
    assert failed is not None and failed.state == "human_review"
    assert done is not None and done.state == "complete"

    outputs: dict[str, str] = {}
    relay = _cli(env, "relay", "--drain", "--no-listen", "--json-logs")
    assert relay.code == 0, relay.err
    outputs["relay log"] = relay.out + relay.err
    consumer = subprocess.Popen(
        [sys.executable, "-c", "from outboxkit.cli.main import main; main()", "consume",
         "tests.support.leak_app:app", "--group", f"leak-{uuid.uuid4().hex[:6]}"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        letters = await wait_for(
            lambda: read_topic(kafka_bootstrap, f"{topic}.dlq", 1, timeout=5),
            lambda records: len(records) >= 1,
            90,
            "the dead letter",
        )
    finally:
        consumer.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            out, err = consumer.communicate(timeout=30)
            outputs["consume log"] = out + err
        consumer.kill()
    assert "consume log" in outputs
    outputs["dlq topic headers"] = repr([r.headers for r in letters])
    for variable in ("OUTBOXKIT_DB_URL", "OUTBOXKIT_KAFKA_BOOTSTRAP"):
        monkeypatch.setenv(variable, env[variable])
    app = ("--app", "tests.support.leak_app:build_engine")  # its redact_keys
    for name, argv in {
        "status": ("status", "--json"),
        "dlq show": ("dlq", "show", f"{topic}.dlq", "0"),
        "dlq show --json": ("dlq", "show", f"{topic}.dlq", "0", "--json"),
        "workflows list": ("workflows", "list"),
        "workflows list --json": ("workflows", "list", "--json"),
        "workflows show": ("workflows", "show", T, "W-fail", *app),
        "workflows show --json": ("workflows", "show", T, "W-fail", "--json", *app),
        "workflows show ok": ("workflows", "show", T, "W-ok", *app),
        "workflows show ok --json": ("workflows", "show", T, "W-ok", "--json", *app),
    }.items():
        # in this process (the same CLI code, without nine interpreter start-ups)
        result = await cli(*argv)
        outputs[name] = result.out + result.err
    tables = _tables(url)
    event_topic = _records(await read_topic(kafka_bootstrap, topic, 1, timeout=10))
    workflow_topic = _records(await read_topic(kafka_bootstrap, f"{topic}-wf", 1, timeout=10))
    places = {
        **{f"table {name}": rows for name, rows in tables.items()},
        **{f"output {name}": text_ for name, text_ in outputs.items()},
        "topic events": event_topic,
        "topic dead letters": _records(letters),
        "topic workflow events": workflow_topic,
    }
    # Where each canary may be: docs/operations.md, "What never leaves the process".
    event_data = {"table outbox_events", "topic events", "topic dead letters"}
    allowed = {
        "event_secret": event_data,
        "event_field": event_data | {"output dlq show", "output dlq show --json"},
        "api_key": {"table workflow_instances"},
        "private_key": {"table workflow_instances"},
        "passphrase": {"table workflow_instances"},
        "personal": {"table workflow_instances"},
        "workflow_input": {"table workflow_instances", "table workflow_history",
                           "topic workflow events", "output workflows show --json",
                           "output workflows show ok --json"},
        "signal_field": {"table workflow_instances", "table workflow_signals",
                         "table workflow_history", "topic workflow events",
                         "output workflows show ok --json"},
    }  # fmt: skip
    found = {
        (canary, place)
        for canary, value in canaries.items()
        for place, content in places.items()
        if value in content and place not in allowed.get(canary, set())
    }
    assert found == set()
    # the hunt looked where the canaries are meant to be, so it can see them
    assert canaries["api_key"] in tables["workflow_instances"]
    assert canaries["event_secret"] in event_topic
    assert json.loads(outputs["workflows show --json"])["summary"]["state"] == "human_review"
