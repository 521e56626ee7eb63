"""A tool call on PostgreSQL is two statements on the driver's own connection (the claim and
the finish, each with its audit rows and events), none through SQLAlchemy's session; the
ledger records what it records on SQLite, through sessions."""

from __future__ import annotations

from typing import Any

import pytest
from outboxkit.actions import ActionStore, State, run_action
from outboxkit.outbox.driver import DriverSession
from sqlalchemy import event

from tests.support.actions import audit_of, event_types, sessions_for

T = "acme"


async def test_a_tool_call_is_two_driver_statements_and_writes_its_records(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    driver_statements: list[str] = []
    first = DriverSession.first

    async def counted(driver: DriverSession, statement: Any, parameters: Any) -> Any:
        driver_statements.append(str(statement).split()[0])
        return await first(driver, statement, parameters)

    monkeypatch.setattr(DriverSession, "first", counted)
    calls: list[str] = []
    async with sessions_for(db_url) as sessions:
        session_statements: list[str] = []
        engine = sessions.kw["bind"].sync_engine
        listener = lambda *args: session_statements.append(args[2])  # noqa: E731
        event.listen(engine, "before_cursor_execute", listener)

        async def lookup(idempotency_key: str) -> dict[str, str]:
            calls.append(idempotency_key)
            return {"status": "shipped"}

        outcome = await run_action(
            sessions, ActionStore(), lookup, tenant=T, key="call-1",
            action_type="agent.tool.lookup", params={"order": "o-1"}, timeout_s=10,
        )  # fmt: skip
        event.remove(engine, "before_cursor_execute", listener)
    assert outcome.executed and outcome.operation.state is State.SUCCEEDED
    assert outcome.result == {"status": "shipped"} and len(calls) == 1
    assert event_types(db_url, T, "call-1") == ["requested", "started", "succeeded"]
    assert audit_of(db_url, T, "call-1") == [
        (None, "PENDING"), ("PENDING", "RUNNING"), ("RUNNING", "SUCCEEDED"),
    ]  # fmt: skip
    if db_url.startswith("postgresql"):
        assert driver_statements == ["WITH", "WITH"] and session_statements == []
    else:
        assert driver_statements == [] and session_statements
