"""A consumer app in sequence mode (``on_dead_letter="sequence"``) for the ordering tests.

Its handler writes one ``consumer_effects`` row per application (``n`` of the widget, in commit
order by the row id) and rejects for good every widget whose ``n`` is listed in the
``sequence_poison`` table: a test "fixes" a poison record by deleting its row, then replays it.
Run as a process: ``python -m tests.support.sequence_apps --db-url URL --bootstrap HOST:PORT
--group GROUP [--crash-after N]`` (input topic from ``OUTBOXKIT_TEST_TOPIC``); with
``--crash-after`` it SIGKILLs itself right after its Nth database commit.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from cloudevents.core.v1.event import CloudEvent
from outboxkit.consumers import ConsumerApp
from outboxkit.consumers.runtime import ConsumerRuntime, serve
from outboxkit.outbox import PermanentError
from outboxkit.outbox.db import make_engine
from outboxkit.outbox.kafka_settings import KafkaSettings
from outboxkit.outbox.logs import configure_logging
from sqlalchemy import Column, Integer, MetaData, Table, insert, select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.pool import NullPool

from tests.support.consumer_apps import WIDGET_TYPE, Widget, consumer_effects, effects_metadata
from tests.support.consumers import FAST_RETRY
from tests.support.crashing_consumer import crash_after

ROOT = Path(__file__).resolve().parents[2]
poison_metadata = MetaData()
sequence_poison = Table("sequence_poison", poison_metadata, Column("n", Integer, primary_key=True))


class WidgetRejected(PermanentError):
    """The widget is refused for good (until a test deletes its poison row)."""


def create_tables(db_url: str, poison: list[int]) -> None:
    """Create the effects and poison tables, with ``poison`` listed."""
    engine = make_engine(db_url, poolclass=NullPool)
    effects_metadata.create_all(engine)
    poison_metadata.create_all(engine)
    with engine.begin() as connection:
        for n in poison:
            connection.execute(insert(sequence_poison).values(n=n))
    engine.dispose()


def fix(db_url: str, n: int) -> None:
    """Make widget ``n`` pass from now on."""
    engine = make_engine(db_url, poolclass=NullPool)
    with engine.begin() as connection:
        connection.execute(sequence_poison.delete().where(sequence_poison.c.n == n))
    engine.dispose()


def sequence_app(topic: str, name: str = "billing", **options: Any) -> ConsumerApp:
    """The app: every widget handler in sequence mode, rejecting the poison ones."""
    options.setdefault("retry", FAST_RETRY)
    app = ConsumerApp(name=name, retention_interval_s=None, on_dead_letter="sequence", **options)

    @app.handler(WIDGET_TYPE, topic=topic)
    async def record(item: Widget, event: CloudEvent, session: AsyncSession) -> None:
        poisoned = await session.scalar(
            select(sequence_poison.c.n).where(sequence_poison.c.n == item.n)
        )
        if poisoned is not None:
            raise WidgetRejected(f"widget {item.n} is refused")
        await session.execute(
            insert(consumer_effects).values(
                consumer=name,
                source=event.get_source(),
                event_id=event.get_id(),
                n=item.n,
                pid=os.getpid(),
            )
        )

    return app


def start(
    db_url: str,
    bootstrap: str,
    group: str,
    topic: str,
    log: Path,
    crash_after_commits: int | None = None,
) -> subprocess.Popen[bytes]:
    """Start the app as a child process logging to ``log``."""
    crash = [] if crash_after_commits is None else ["--crash-after", str(crash_after_commits)]
    with open(log, "ab") as output:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.support.sequence_apps",
                "--db-url",
                db_url,
                "--bootstrap",
                bootstrap,
                "--group",
                group,
                *crash,
            ],
            cwd=ROOT,
            stdout=output,
            stderr=subprocess.STDOUT,
            env={**os.environ, "OUTBOXKIT_TEST_TOPIC": topic},
        )


def main() -> None:
    """Run the app until SIGTERM (or its crash)."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--db-url", required=True)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--crash-after", type=int)
    args = parser.parse_args()
    configure_logging("INFO")
    app = sequence_app(
        os.environ["OUTBOXKIT_TEST_TOPIC"],
        consumer_options={"session_timeout_ms": 6000, "heartbeat_interval_ms": 1000},
    )
    runtime = ConsumerRuntime(
        app,
        kafka=KafkaSettings(bootstrap=args.bootstrap),
        db_url=args.db_url,
        group=args.group,
        on_db_commit=None if args.crash_after is None else crash_after(args.crash_after),
    )
    asyncio.run(serve(runtime))


if __name__ == "__main__":
    main()
