"""Waiters of one process share one LISTEN connection (issue 38): 40 callers waiting for an
operation another caller is running add one server connection, not 40, and all are woken by
its finish; a lost connection is reopened and says so."""

from __future__ import annotations

import asyncio
import logging

import psycopg
import pytest
from outboxkit.actions import ActionStore, run_action
from outboxkit.outbox import shared_listen
from outboxkit.outbox.backoff import Backoff
from sqlalchemy.engine import make_url

from tests.support.actions import sessions_for
from tests.support.kafka import wait_for
from tests.support.waits import scaled

POOL = 5
WAITERS = 40
# Waiters that would poll only after a minute: a finish seen sooner came by notification.
NO_POLL = Backoff(base_s=60.0, cap_s=60.0, floor_s=60.0)


def count(url: str, sql: str) -> int:
    with psycopg.connect(make_url(url).render_as_string(hide_password=False)) as conn:
        row = conn.execute(sql).fetchone()
    return int(row[0]) if row else 0


def server_connections(url: str) -> int:
    """Client connections to this test's database, not counting the one asking."""
    return count(
        url,
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND backend_type = 'client backend' AND pid <> pg_backend_pid()",
    )


def terminate_listeners(url: str) -> int:
    return count(
        url,
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
        "WHERE datname = current_database() AND query LIKE 'LISTEN%'",
    )


class HeldAction:
    """An action that runs until released: its operation stays RUNNING meanwhile."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.release = asyncio.Event()

    async def __call__(self, _key: str) -> dict[str, int]:
        self.started.set()
        await self.release.wait()
        return {"refunded": 5}


async def call(sessions, store: ActionStore, action) -> object:
    return await run_action(
        sessions,
        store,
        action,
        tenant="acme",
        key="op-1",
        action_type="refund",
        params={"amount": 5},
        timeout_s=scaled(120),
        wait_in_progress_s=scaled(120),
        poll_backoff=NO_POLL,
    )


async def test_forty_waiters_share_one_listen_connection_and_all_wake(pg_url: str) -> None:
    store = ActionStore()
    held = HeldAction()

    async def never_called(_key: str) -> None:
        raise AssertionError("a waiter ran the action")

    opened = 0

    async with sessions_for(pg_url, pool_size=POOL) as sessions:

        def counted():
            nonlocal opened
            opened += 1
            return sessions()

        runner = asyncio.create_task(call(sessions, store, held))
        await asyncio.wait_for(held.started.wait(), scaled(30))
        waiters = [asyncio.create_task(call(counted, store, never_called)) for _ in range(WAITERS)]
        # A waiter's third session reads the operation after it began watching: then it waits.
        await wait_for(lambda: opened, lambda n: n >= 3 * WAITERS, 30, "40 waiters to wait")
        counts = [server_connections(pg_url) for _ in range(5)]
        assert max(counts) <= POOL + 1, counts  # the pool and one LISTEN connection
        assert shared_listen.open_connections() == 1

        held.release.set()
        done = await asyncio.wait_for(asyncio.gather(runner, *waiters), scaled(30))
        assert done[0].executed
        assert [outcome.executed for outcome in done[1:]] == [False] * WAITERS
        assert shared_listen.open_connections() == 0  # closed after the last waiter left
        assert shared_listen.subscriber_count() == 0


async def test_a_lost_listen_connection_wakes_waiters_and_comes_back(
    pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="outboxkit.listen")
    store = ActionStore()
    held = HeldAction()

    async def never_called(_key: str) -> None:
        raise AssertionError("a waiter ran the action")

    async with sessions_for(pg_url, pool_size=POOL) as sessions:
        runner = asyncio.create_task(call(sessions, store, held))
        await asyncio.wait_for(held.started.wait(), scaled(30))
        waiters = [asyncio.create_task(call(sessions, store, never_called)) for _ in range(3)]
        await wait_for(shared_listen.subscriber_count, lambda n: n == 3, 30, "3 waiters")
        assert terminate_listeners(pg_url) == 1
        await wait_for(lambda: caplog.text, lambda t: "LISTEN restored" in t, 30, "restored")
        assert caplog.text.count("LISTEN connection lost") == 1
        assert shared_listen.open_connections() == 1

        held.release.set()  # woken by a notification on the reopened connection
        done = await asyncio.wait_for(asyncio.gather(runner, *waiters), scaled(30))
        assert [outcome.executed for outcome in done] == [True, False, False, False]
