"""A consumer process that SIGKILLs itself right after its Nth database commit.

``python -m tests.support.crashing_consumer --db-url URL --bootstrap HOST:PORT --group GROUP
--after N --max-batch B`` runs ``effects_app`` (:mod:`tests.support.consumer_apps`, input topic
from ``OUTBOXKIT_TEST_TOPIC``) with an ``on_db_commit`` hook that kills the process after the
Nth database commit, before the runtime commits the matching Kafka offsets: the worst moment
for a crash, chosen by the test and wired in here, with no switch in the library.
``--max-batch`` bounds the records fetched at once, so one commit cannot cover every event.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from outboxkit.consumers.runtime import ConsumerRuntime, serve
from outboxkit.outbox.kafka_settings import KafkaSettings
from outboxkit.outbox.logs import configure_logging

from tests.support.consumer_apps import effects_app

ROOT = Path(__file__).resolve().parents[2]


def crash_after(commits: int) -> Callable[[], None]:
    """An ``on_db_commit`` hook that SIGKILLs this process on database commit ``commits``."""
    seen = 0

    def on_db_commit() -> None:
        nonlocal seen
        seen += 1
        if seen >= commits:
            print(f"crashing_consumer: SIGKILL after database commit {seen}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

    return on_db_commit


def start(
    db_url: str, bootstrap: str, group: str, *, after: int, max_batch: int, topic: str, log: Path
) -> subprocess.Popen[bytes]:
    """Start this module as a child process logging to ``log``."""
    with open(log, "ab") as output:
        return subprocess.Popen(
            [
                *(sys.executable, "-m", "tests.support.crashing_consumer"),
                *("--db-url", db_url, "--bootstrap", bootstrap, "--group", group),
                *("--after", str(after), "--max-batch", str(max_batch)),
            ],
            cwd=ROOT,
            stdout=output,
            stderr=subprocess.STDOUT,
            env={**os.environ, "OUTBOXKIT_TEST_TOPIC": topic},
        )


def main() -> None:
    """Parse the arguments and run the consumer until it kills itself (or SIGTERM)."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--db-url", required=True)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--after", type=int, required=True, help="database commits to survive")
    parser.add_argument("--max-batch", type=int, required=True, help="records fetched at once")
    args = parser.parse_args()
    configure_logging("INFO")
    runtime = ConsumerRuntime(
        effects_app,
        kafka=KafkaSettings(bootstrap=args.bootstrap),
        db_url=args.db_url,
        group=args.group,
        consumer_options={"max_poll_records": args.max_batch},
        on_db_commit=crash_after(args.after),
    )
    asyncio.run(serve(runtime))


if __name__ == "__main__":
    main()
