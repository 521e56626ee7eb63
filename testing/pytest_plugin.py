"""outboxkit's pytest plugin: a real broker, throwaway migrated databases, and a deterministic
wait for a consumer app. Opt in with one line in your ``conftest.py``::

    pytest_plugins = ["outboxkit.testing.pytest_plugin"]

It is not registered through a ``pytest11`` entry point on purpose: installing outboxkit then
changes no one's test session (no broker start, no fixture names) until asked. The fixtures are
named ``outboxkit_*`` so they cannot collide with a suite's own. They are synchronous fixtures
(the waiting helper is a plain coroutine function), so they work the same under pytest-asyncio's
strict and auto modes.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from outboxkit.consumers.app import ConsumerApp
from outboxkit.migrations import upgrade
from outboxkit.testing.kafka import broker_from_env
from outboxkit.testing.postgres import throwaway_database
from outboxkit.testing.waiting import wait_until_applied


@pytest.fixture(scope="session")
def outboxkit_kafka() -> Iterator[str]:
    """Bootstrap address of a real broker: ``OUTBOXKIT_KAFKA_BOOTSTRAP``, or a single-node
    KRaft broker started from the Maven jars for the session (Java 17 and Maven needed)."""
    with broker_from_env() as bootstrap:
        yield bootstrap


@pytest.fixture
def outboxkit_sqlite_url(tmp_path: Path) -> str:
    """URL of a fresh SQLite file with outboxkit's tables."""
    url = f"sqlite:///{tmp_path / 'outboxkit.db'}"
    upgrade(url)
    return url


@pytest.fixture
def outboxkit_pg_url() -> Iterator[str]:
    """URL of a fresh PostgreSQL database with outboxkit's tables, on the server named by
    ``OUTBOXKIT_TEST_PG_URL``; dropped after the test."""
    with throwaway_database("outboxkit_plugin") as url:
        yield url


@pytest.fixture
def outboxkit_wait_applied(
    outboxkit_kafka: str,
) -> Callable[..., Awaitable[Any]]:
    """``await outboxkit_wait_applied(app)``: returns once ``app``'s group has committed past
    everything published to its topics so far (no sleeps; ``timeout_s=60`` by default)."""

    async def wait(app: ConsumerApp, *, group: str | None = None, timeout_s: float = 60.0) -> Any:
        return await wait_until_applied(app, outboxkit_kafka, group=group, timeout_s=timeout_s)

    return wait
