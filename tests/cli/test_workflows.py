"""``outboxkit workflows list|show|cancel|resume|escalate|run``: instances made by the real engine
(tests/support/workflow_ops.py), read and changed through the real CLI entry point.

The CLI runs ``asyncio.run`` itself, so it is called in a worker thread (no running loop there).
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
from outboxkit.cli.main import _is_long_running, main
from outboxkit.outbox.tables import outbox_events
from outboxkit.testing.kafka import free_port
from outboxkit.workflows import Status, request_hash
from sqlalchemy import func, select

from tests.cli.test_signals import wait_until_held
from tests.support import workflow_ops as w
from tests.support.actions import sessions_for
from tests.support.kafka import wait_for
from tests.support.waits import scaled

APP = "tests.support.workflow_ops:build_engine"


def run_cli(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            main(list(args))
            code = 0
        except SystemExit as exit_:
            code = exit_.code or 0
    return code, out.getvalue(), err.getvalue()


async def cli(*args: str) -> tuple[int, str, str]:
    return await asyncio.to_thread(run_cli, *args)


async def seed(engine) -> None:
    """PO-ok (ordered, awaiting delivery), PO-flaky (retrying), PO-unk (human_review with an
    unknown order), PO-wait (awaiting approval), PO-queued (started, never run)."""
    modes = {"PO-ok": "ok", "PO-flaky": "flaky", "PO-unk": "unknown", "PO-wait": "ok"}
    for workflow_id, mode in modes.items():
        await w.start(engine, workflow_id, mode=mode)
    for workflow_id in modes:
        await w.settle(engine, workflow_id, lambda r: r.status is Status.WAITING)
    for workflow_id in ("PO-ok", "PO-flaky", "PO-unk"):
        await w.approve(engine, workflow_id)
    await w.settle(engine, "PO-ok", lambda r: r.state == "await_delivery")
    await w.settle(engine, "PO-flaky", lambda r: r.attempts >= 1)
    await w.settle(engine, "PO-unk", lambda r: r.state == "human_review")
    await w.start(engine, "PO-queued")


async def test_list_shows_state_deadline_attempts_unknowns_and_approvals(db_url: str) -> None:
    async with sessions_for(db_url) as sessions:
        await seed(w.build_engine(sessions))

    code, out, _ = await cli("workflows", "list", "--json", "--db-url", db_url)
    assert code == 0
    rows = {row["workflow_id"]: row for row in json.loads(out)}
    assert set(rows) == {"PO-ok", "PO-flaky", "PO-unk", "PO-wait", "PO-queued"}
    assert {k: r["state"] for k, r in rows.items()} == {
        "PO-ok": "await_delivery",
        "PO-flaky": "execute",
        "PO-unk": "human_review",
        "PO-wait": "await_approval",
        "PO-queued": "intake",
    }
    assert rows["PO-wait"]["approval"] == "awaiting" and rows["PO-ok"]["approval"] == "approved"
    assert rows["PO-queued"]["approval"] == "none"
    assert rows["PO-wait"]["deadline_kind"] == "wait" and rows["PO-wait"]["deadline_ms"]
    assert rows["PO-unk"]["open_unknown"] == "PO-unk:issue:v1"
    assert rows["PO-flaky"]["attempts"] >= 1 and rows["PO-flaky"]["failure_class"] == "transient"
    assert rows["PO-flaky"]["next_run_ms"] is not None
    assert all(r["owner"] == "alice" and r["cancel_requested_ms"] is None for r in rows.values())

    code, out, _ = await cli("workflows", "list", "--db-url", db_url)
    header = out.splitlines()[0].split()
    assert code == 0 and header[:4] == ["TENANT", "WORKFLOW", "NAME", "STATE"]
    assert "APPROVAL" in header and "UNKNOWN" in header and "DEADLINE" in header
    assert "PO-unk:issue:v1" in out and "awaiting" in out

    async def ids(*args: str) -> set[str]:
        code, out, err = await cli("workflows", "list", "--json", "--db-url", db_url, *args)
        assert code == 0, err
        return {row["workflow_id"] for row in json.loads(out)}

    assert await ids("--state", "human_review") == {"PO-unk"}
    assert await ids("--state", "human_review,await_approval") == {"PO-unk", "PO-wait"}
    assert await ids("--state", "human_review", "--state", "intake") == {"PO-unk", "PO-queued"}
    assert await ids("--name", "invoice") == set()
    assert await ids("--tenant", "globex") == set()
    # due and not taken forward: the queued start (and the retry, once its backoff is due);
    # waiting instances are not stuck
    stuck = await ids("--stuck-after", "0s")
    assert "PO-queued" in stuck and stuck <= {"PO-queued", "PO-flaky"}
    assert await ids("--stuck-after", "1h") == set()

    code, out, err = await cli("workflows", "list", "--stuck-after", "soon", "--db-url", db_url)
    assert code == 2 and "is not a duration" in err and len(err.strip().splitlines()) == 1


async def test_show_explains_the_instance_and_what_comes_next(db_url: str) -> None:
    async with sessions_for(db_url) as sessions:
        await seed(w.build_engine(sessions))

    code, out, _ = await cli("workflows", "show", "acme", "PO-unk", "--db-url", db_url)
    assert code == 0
    assert "next:          human_review: resolve operation 'PO-unk:issue:v1' first" in out
    assert "resume [--to STATE] (default execute), cancel" in out
    assert "last good:     #4 resume await_approval -> execute" in out
    assert "pending step:  execute, attempts 0; unknown_outcome:" in out
    assert "PO-unk:issue:v1 (open) UNKNOWN (orders.issue)" in out
    assert "unknown      execute -> human_review by worker" in out
    assert "approval.granted from approvals (approval-PO-unk): consumed" in out

    async def show(workflow_id: str, *extra: str) -> dict:
        code, out, err = await cli(
            "workflows", "show", "acme", workflow_id, "--json", "--db-url", db_url, *extra
        )
        assert code == 0, err
        return json.loads(out)

    ordered = await show("PO-ok")
    assert ordered["effects"] == [
        {
            "seq": 5,
            "action_type": "orders.issue",
            "key": "PO-ok:issue:v1",
            "executed": True,
            "external_ref": None,
        }
    ]
    assert ordered["approval"]["request_hash"] == request_hash({"amount": 5})
    assert ordered["approval"]["ref"] == "approvals/approval-PO-ok"
    assert ordered["last_good"]["kind"] == "wait" and ordered["last_good"]["to"] == "await_delivery"
    assert ordered["next_action"].startswith("waiting for delivery.confirmed from suppliers until")
    assert [h["kind"] for h in ordered["history"]] == [
        "start",
        "transition",
        "wait",
        "resume",
        "transition",
        "wait",
    ]

    waiting = await show("PO-wait")
    assert waiting["summary"]["approval"] == "awaiting"
    assert waiting["awaiting_request_hash"] == request_hash({"amount": 5})
    assert waiting["next_action"].startswith(
        "waiting for approval.granted|approval.rejected from approvals until"
    )
    assert waiting["next_action"].endswith("then expired")

    retrying = await show("PO-flaky", "--app", APP)
    assert retrying["pending_step"]["failure_class"] == "transient"
    assert "supplier API answered 503" in retrying["pending_step"]["last_error"]
    attempts = retrying["pending_step"]["attempts"]
    assert f"(attempt {attempts + 1} of 3)" in retrying["next_action"]
    assert retrying["next_action"].startswith("retry execute")

    code, _, err = await cli("workflows", "show", "acme", "PO-404", "--db-url", db_url)
    assert (code, err.strip()) == (2, "outboxkit: error: no workflow 'PO-404' of tenant 'acme'")


def transition_events(url: str, workflow_id: str) -> int:
    """Outbox rows of the instance's transition events, on the engine's events topic."""
    from outboxkit.outbox.db import make_engine

    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            return conn.scalar(
                select(func.count())
                .select_from(outbox_events)
                .where(
                    outbox_events.c.topic == w.EVENTS_TOPIC,
                    outbox_events.c.type == "outboxkit.workflow.transitioned",
                    outbox_events.c.event_id.like(f"acme/{workflow_id}/%"),
                )
            )
    finally:
        engine.dispose()


async def test_cancel_resume_escalate_go_through_the_engine(db_url: str) -> None:
    async with sessions_for(db_url) as sessions:
        engine = w.build_engine(sessions)
        await seed(engine)
        app = ("--app", APP, "--db-url", db_url)

        code, out, err = await cli(
            "workflows", "escalate", "acme", "PO-wait", "--by", "ops", "--reason", "call", *app
        )
        assert (code, out.strip()) == (0, "PO-wait (acme): human_review (waiting)"), err
        for to, message in (
            ("nosuch", "cannot resume 'PO-wait' in state 'nosuch'"),
            ("human_review", "cannot resume 'PO-wait' in state 'human_review'"),
        ):
            code, _, err = await cli(
                "workflows", "resume", "acme", "PO-wait", "--by", "ops", "--reason", "r",
                "--to", to, *app,
            )  # fmt: skip
            assert (code, err.strip()) == (2, f"outboxkit: error: {message}")
        code, out, _ = await cli(
            "workflows", "resume", "acme", "PO-wait", "--by", "ops", "--reason", "back", *app
        )
        assert (code, out.strip()) == (0, "PO-wait (acme): await_approval (runnable)")
        code, _, err = await cli(
            "workflows", "resume", "acme", "PO-wait", "--by", "ops", "--reason", "again", *app
        )
        assert code == 2 and "not in human_review" in err
        async with sessions() as session:
            history = await engine.history(session, "acme", "PO-wait")
        operator = [h for h in history if h.kind == "operator"]
        assert [(h.actor, h.decision["action"], h.to_state) for h in operator] == [
            ("ops", "escalate", "human_review"),
            ("ops", "resume", "await_approval"),
        ]
        # each operator decision is a history record published on the engine's events topic
        assert await asyncio.to_thread(transition_events, db_url, "PO-wait") == len(history)

        # cancel after the order was issued: the documented compensation runs, then cancelled
        code, out, _ = await cli(
            "workflows", "cancel", "acme", "PO-ok", "--by", "ops", "--reason", "withdrawn", *app
        )
        assert code == 0 and "cancel asked" in out
        cancelled = await w.settle(engine, "PO-ok", lambda r: r.terminal)
        assert cancelled.state == "cancelled"
        async with sessions() as session:
            kinds = [h.kind for h in await engine.history(session, "acme", "PO-ok")]
        assert kinds[-2:] == ["cancel", "compensate"]
        code, _, err = await cli(
            "workflows", "cancel", "acme", "PO-ok", "--by", "ops", "--reason", "again", *app
        )
        assert code == 2 and err.strip().endswith("workflow 'PO-ok' has ended (cancelled)")

        # an unknown is resolved in the ledger, then the instance resumed: the order is not
        # issued again, the resolved result is used
        issued = len(w.ISSUED)
        code, _, err = await cli(
            "actions", "resolve", "PO-unk:issue:v1", "--tenant", "acme", "--succeeded",
            "--result", '{"order": "o-by-hand"}', "--by", "ops", "--reason", "checked",
            "--db-url", db_url,
        )  # fmt: skip
        assert code == 0, err
        code, out, err = await cli(
            "workflows", "resume", "acme", "PO-unk", "--by", "ops", "--reason", "resolved", *app
        )
        assert (code, out.strip()) == (0, "PO-unk (acme): execute (runnable)"), err
        resumed = await w.settle(engine, "PO-unk", lambda r: r.state == "await_delivery")
        assert resumed.compensations[0].params == {"order": "o-by-hand"}
        assert len(w.ISSUED) == issued

    for args, message in (
        (("cancel", "acme", "PO-404"), "no workflow 'PO-404' of tenant 'acme'"),
        (("escalate", "acme", "PO-ok"), "workflow 'PO-ok' is in 'cancelled'"),
    ):
        code, _, err = await cli("workflows", *args, "--by", "o", "--reason", "r", *app)
        assert code == 2 and err.strip().endswith(message), err
    code, _, err = await cli(
        "workflows", "cancel", "acme", "PO-wait", "--by", "o", "--reason", "r",
        "--app", "tests.support.workflow_ops:po", "--db-url", db_url,
    )  # fmt: skip
    assert code == 2 and "not a WorkflowEngine" in err and len(err.strip().splitlines()) == 1


def spawn_worker(args: list[str], url: str, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "OUTBOXKIT_DB_URL": url, "PYTHONPATH": os.getcwd()}
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-c", "from outboxkit.cli.main import main; main()", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=scaled(5)) as answer:
        return answer.read().decode()


@pytest.mark.skipif(sys.platform == "win32", reason="SIGTERM")
async def test_run_advances_workflows_serves_metrics_and_stops_on_sigterm(
    pg_url: str, tmp_path: Path
) -> None:
    port = free_port()
    log = tmp_path / "worker.log"
    worker = spawn_worker(
        ["workflows", "run", "tests.support.workflow_ops:engine", "--poll-interval", "100ms",
         "--metrics-port", str(port)],
        pg_url,
        log,
    )  # fmt: skip
    try:
        async with sessions_for(pg_url) as sessions:
            engine = w.build_engine(sessions)
            await w.start(engine, "PO-run")
            waiting = await wait_for(
                lambda: w.get(engine, "PO-run"),
                lambda r: r.state == "await_approval" and r.status is Status.WAITING,
                30,
                "the worker to reach the approval wait",
            )
            assert waiting.attempts == 0
            await w.approve(engine, "PO-run")
            await wait_for(
                lambda: w.get(engine, "PO-run"),
                lambda r: r.state == "await_delivery",
                30,
                "the worker to issue the order",
            )
        text = await asyncio.to_thread(scrape, port)
        assert 'outboxkit_workflow_instances{state="await_delivery",workflow="po"} 1.0' in text
        assert "outboxkit_workflow_collector_up 1.0" in text
        assert 'outboxkit_workflow_transitions_total{kind="resume",workflow="po"} 1.0' in text
        worker.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(worker.wait, 60) == 0
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait(scaled(10))
    output = log.read_text()
    assert "workflow worker" in output and "started" in output and "stopped after" in output


@pytest.mark.parametrize(
    ("signum", "after_s"),
    [(signal.SIGTERM, 0.0), (signal.SIGINT, 0.3), (signal.SIGTERM, None)],
)
def test_run_stopped_at_any_moment_of_start_up_exits_0(
    sqlite_url: str, tmp_path: Path, signum: int, after_s: float | None
) -> None:
    log = tmp_path / "worker.log"
    process = spawn_worker(["workflows", "run", APP, "--db-url", sqlite_url], sqlite_url, log)
    try:
        wait_until_held(process)
        if after_s is None:
            deadline = time.monotonic() + scaled(60)
            while " started" not in log.read_text():
                assert process.poll() is None and time.monotonic() < deadline
                time.sleep(0.05)
        else:
            time.sleep(after_s)
        process.send_signal(signum)
        assert process.wait(scaled(60)) == 0, log.read_text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(scaled(10))
    assert "Traceback" not in log.read_text()


def test_only_workflows_run_keeps_the_stop_signals() -> None:
    assert _is_long_running(["workflows", "run", APP])
    assert _is_long_running(["--config", "f.toml", "workflows", "run", APP])
    assert _is_long_running(["relay", "--db-url", "x"])
    assert not _is_long_running(["workflows", "list", "--db-url", "x"])
    assert not _is_long_running(["workflows", "--help"])
    assert not _is_long_running(["--config", "run", "workflows", "show", "acme", "run"])
