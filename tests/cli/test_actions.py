"""``outboxkit actions list|show|resolve``: real database, the real CLI entry point.

The CLI runs ``asyncio.run`` itself, so it is called in a worker thread (no running loop there).
"""

from __future__ import annotations

import asyncio
import io
import json
from contextlib import redirect_stderr, redirect_stdout

import pytest
from outboxkit.actions import ActionStore, State
from outboxkit.cli.main import main

from tests.support import approvals
from tests.support.actions import begin, event_types, in_tx, sessions_for

REQ = {"action_type": "payments.refund", "params": {"amount": 5}}


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


async def seed(url: str) -> ActionStore:
    """acme/op-unknown UNKNOWN, acme/op-done SUCCEEDED, globex/op-unknown UNKNOWN."""
    store = ActionStore()
    async with sessions_for(url) as sessions:
        for tenant, key in (("acme", "op-unknown"), ("acme", "op-done"), ("globex", "op-unknown")):
            claimed = await begin(sessions, store, tenant=tenant, key=key, **REQ)
            if key == "op-done":
                await in_tx(sessions, lambda s, c=claimed: store.complete(s, c.lease, result=1))
            else:
                await in_tx(
                    sessions, lambda s, c=claimed: store.mark_unknown(s, c.lease, "timeout")
                )
    return store


async def test_list_filters_by_state_age_and_tenant(db_url: str) -> None:
    await seed(db_url)
    code, out, _ = await cli(
        "actions", "list", "--state", "unknown", "--older-than", "0s", "--json", "--db-url", db_url
    )
    assert code == 0
    listed = json.loads(out)
    assert sorted((op["tenant"], op["key"]) for op in listed) == [
        ("acme", "op-unknown"),
        ("globex", "op-unknown"),
    ]
    assert all(op["state"] == "UNKNOWN" for op in listed)

    code, out, _ = await cli("actions", "list", "--tenant", "acme", "--db-url", db_url)
    assert code == 0 and "op-done" in out and "op-unknown" in out and "globex" not in out

    code, out, _ = await cli("actions", "list", "--older-than", "1h", "--db-url", db_url)
    assert (code, out.strip()) == (0, "no operations")


async def test_show_prints_the_operation_with_its_audit_trail(db_url: str) -> None:
    await seed(db_url)
    code, out, _ = await cli(
        "actions", "show", "op-unknown", "--tenant", "acme", "--db-url", db_url
    )
    assert code == 0
    assert "state:" in out and "UNKNOWN" in out and "RUNNING -> UNKNOWN" in out

    code, out, _ = await cli(
        "actions", "show", "op-unknown", "--tenant", "acme", "--json", "--db-url", db_url
    )
    shown = json.loads(out)
    assert shown["operation"]["tenant"] == "acme"
    assert [(a["from"], a["to"]) for a in shown["audit"]] == [
        (None, "PENDING"),
        ("PENDING", "RUNNING"),
        ("RUNNING", "UNKNOWN"),
    ]


async def test_resolve_by_hand_is_audited_and_published(db_url: str) -> None:
    store = await seed(db_url)
    code, out, err = await cli(
        "actions",
        "resolve",
        "op-unknown",
        "--tenant",
        "acme",
        "--succeeded",
        "--result",
        '{"id": "re_5"}',
        "--by",
        "alice",
        "--reason",
        "found in the provider dashboard",
        "--db-url",
        db_url,
    )
    assert code == 0, err
    assert "SUCCEEDED" in out
    async with sessions_for(db_url) as sessions:
        op = await in_tx(sessions, lambda s: store.get(s, "acme", "op-unknown"))
        other = await in_tx(sessions, lambda s: store.get(s, "globex", "op-unknown"))
        trail = await in_tx(sessions, lambda s: store.history(s, "acme", "op-unknown"))
    assert op.state is State.SUCCEEDED and op.result == {"id": "re_5"}
    assert other.state is State.UNKNOWN  # the other tenant's operation is untouched
    assert trail[-1].actor == "alice" and "provider dashboard" in trail[-1].reason
    assert event_types(db_url, "acme", "op-unknown")[-1] == "reconciled"

    code, _, _ = await cli(
        "actions", "resolve", "op-unknown", "--tenant", "globex", "--retry",
        "--by", "bob", "--reason", "not at the provider", "--db-url", db_url,
    )  # fmt: skip
    assert code == 0
    assert event_types(db_url, "globex", "op-unknown")[-1] == "reconciled"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["list", "--state", "DONE"], "invalid state 'DONE'"),
        (["list", "--older-than", "10 minutes"], "is not a duration"),
        (["list", "--tenant", "a/b"], "tenant must be"),
        (["show", "missing", "--tenant", "acme"], "no operation 'missing'"),
        (
            ["resolve", "op-unknown", "--tenant", "acme", "--by", "a", "--reason", "r"],
            "exactly one",
        ),
        (
            ["resolve", "op-unknown", "--tenant", "acme", "--succeeded", "--failed",
             "--by", "a", "--reason", "r"],
            "exactly one",
        ),
        (
            ["resolve", "op-unknown", "--tenant", "acme", "--succeeded", "--result", "{bad",
             "--by", "a", "--reason", "r"],
            "--result is not valid JSON",
        ),
        (
            ["resolve", "op-done", "--tenant", "acme", "--retry", "--by", "a", "--reason", "r"],
            "cannot go from SUCCEEDED to PENDING",
        ),
        (
            ["resolve", "nope", "--tenant", "acme", "--failed", "--by", "a", "--reason", "r"],
            "no operation 'nope'",
        ),
        (["resolve", "op-unknown", "--tenant", "acme", "--failed", "--by", "a"], "--reason"),
    ],
)  # fmt: skip
async def test_bad_input_is_one_line_and_exit_code_2(
    sqlite_url: str, args: list[str], message: str
) -> None:
    await seed(sqlite_url)
    code, out, err = await cli("actions", *args, "--db-url", sqlite_url)
    assert code == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("outboxkit: error:"), err
    assert message in lines[0]
    assert "Traceback" not in err


async def test_approvals_lists_the_calls_waiting_for_a_person_oldest_first_and_pages(
    db_url: str,
) -> None:
    args = {"charge_id": "ch_7", "amount_cents": 900, "password": "hunter2"}
    fresh = await approvals.request(db_url, "acme", "ticket-1", args)
    await approvals.request(db_url, "acme", "ticket-2", {"charge_id": "ch_8"}, decided=True)
    await approvals.request(
        db_url, "globex", "ticket-3", {"charge_id": "ch_9"}, ttl_s=60, age_s=120
    )
    code, out, err = await cli("actions", "approvals", "--db-url", db_url)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].split()[:5] == ["TENANT", "RUN", "CALL", "TOOL", "ARGS"]
    assert [line.split()[:4] for line in lines[1:]] == [
        ["acme", "ticket-1", "call-0", "refund"], ["globex", "ticket-3", "call-0", "refund"],
    ]  # fmt: skip
    assert fresh[:16] in lines[1] and "ch_7" not in out  # text shows the hash only
    assert lines[2].endswith("(expired)") and not lines[1].endswith("(expired)")
    code, out, _ = await cli("actions", "approvals", "--json", "--limit", "1", "--db-url", db_url)
    page = json.loads(out)
    [first] = page["approvals"]
    assert first["run_id"] == "ticket-1" and first["args_hash"] == fresh
    assert first["args"] == {**args, "password": "[redacted]"} and not first["expired"]
    code, out, _ = await cli(
        "actions", "approvals", "--json", "--next", page["next"], "--db-url", db_url
    )
    assert [a["run_id"] for a in json.loads(out)["approvals"]] == ["ticket-3"]
    code, out, _ = await cli(
        "actions", "approvals", "--tenant", "acme", "--json", "--db-url", db_url
    )
    assert [a["tenant"] for a in json.loads(out)["approvals"]] == ["acme"]
    code, _, err = await cli("actions", "approvals", "--next", "soon", "--db-url", db_url)
    assert code == 2 and "invalid --next 'soon'" in err
