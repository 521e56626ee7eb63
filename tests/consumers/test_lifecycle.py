"""The runtime's lifecycle: ``async with`` on a shared engine, an idempotent stop, one start."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest
from outboxkit.consumers import ConsumerError, ConsumerRuntime
from outboxkit.migrations.runner import downgrade
from outboxkit.outbox.db import make_async_engine
from outboxkit.outbox.kafka_settings import KafkaSettings
from outboxkit.testing.kafka import create_topic
from sqlalchemy import text

from tests.support.consumers import (
    committed_offsets,
    create_effects_table,
    effect_rows,
    effects_app_for,
    produce_events,
    widget,
)
from tests.support.kafka import wait_for


async def test_async_with_applies_commits_and_leaves_a_shared_engine_open(
    pg_url: str, kafka_bootstrap: str, topic: str
) -> None:
    create_effects_table(pg_url)
    await create_topic(kafka_bootstrap, topic)
    await produce_events(kafka_bootstrap, topic, [widget(n) for n in range(3)])
    engine = make_async_engine(pg_url)
    group = f"lifecycle-{uuid.uuid4().hex[:8]}"
    runtime = ConsumerRuntime(
        effects_app_for(topic),
        kafka=KafkaSettings(bootstrap=kafka_bootstrap),
        engine=engine,
        group=group,
    )
    try:
        async with runtime:
            await wait_for(lambda: runtime.stats.applied, lambda n: n == 3, 60, "3 effects")
        # Leaving the block drained the offset queue: all three are committed.
        assert sum((await committed_offsets(kafka_bootstrap, group)).values()) == 3
        assert runtime.stats.offset_commits >= 1 and len(effect_rows(pg_url)) == 3
        await runtime.stop()  # idempotent
        with pytest.raises(ConsumerError, match="starts once"):
            await runtime.start()
        async with engine.connect() as connection:  # the caller's engine is still open
            assert await connection.scalar(text("select 1")) == 1
    finally:
        await engine.dispose()


async def test_run_raises_a_start_failure_and_leaves_nothing_running(tmp_path: Path) -> None:
    empty = f"sqlite:///{tmp_path / 'not-migrated.db'}"
    runtime = ConsumerRuntime(
        effects_app_for("orders"), kafka=KafkaSettings(bootstrap="127.0.0.1:1"), db_url=empty
    )
    with pytest.raises(ConsumerError, match="inbox_events is missing"):
        await runtime.run()
    assert asyncio.all_tasks() == {asyncio.current_task()}
    await runtime.stop()  # after a failed start: a no-op


async def test_a_database_not_migrated_to_this_version_is_refused_before_any_claim(
    pg_url: str,
) -> None:
    """Claims of this version name the partitioned inbox's tables: on a database one migration
    behind, the consumer says so in one line instead of failing every batch."""
    downgrade(pg_url, "0015_awaiting_decisions")
    runtime = ConsumerRuntime(
        effects_app_for("orders"), kafka=KafkaSettings(bootstrap="127.0.0.1:1"), db_url=pg_url
    )
    with pytest.raises(ConsumerError, match="table inbox_windows is missing: run 'outboxkit"):
        await runtime.run()
    await runtime.stop()


def test_exactly_one_of_engine_or_db_url() -> None:
    app = effects_app_for("orders")
    with pytest.raises(ValueError, match="exactly one"):
        ConsumerRuntime(app, kafka=KafkaSettings(bootstrap="127.0.0.1:1"))
    with pytest.raises(ValueError, match="exactly one"):
        ConsumerRuntime(
            app,
            kafka=KafkaSettings(bootstrap="127.0.0.1:1"),
            db_url="sqlite:///x.db",
            engine=make_async_engine("sqlite:///x.db"),
        )
