"""Helpers of the operator-command tests: run the CLI in-process or as a process, offsets."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from outboxkit.cli.main import main

from tests.support.waits import scaled


@dataclass(frozen=True)
class CliResult:
    """Exit code and output of one ``outboxkit`` run."""

    code: int
    out: str
    err: str
    seconds: float

    def json(self) -> Any:
        """stdout parsed as JSON."""
        return json.loads(self.out)

    def error_line(self) -> str:
        """The one stderr line of a failed run; fails unless there is exactly one."""
        lines = self.err.strip().splitlines()
        assert len(lines) == 1, f"expected one stderr line, got: {self.err!r}"
        assert lines[0].startswith("outboxkit: error: "), lines[0]
        return lines[0]


def _run_main(argv: list[str]) -> CliResult:
    out, err = io.StringIO(), io.StringIO()
    code = 0
    began = time.monotonic()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(argv)
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else 1
    return CliResult(code, out.getvalue(), err.getvalue(), time.monotonic() - began)


async def cli(*argv: str) -> CliResult:
    """Run ``outboxkit ARGV`` in-process (in a thread: the command runs its own event loop).

    An unexpected exception (a traceback for the operator) propagates and fails the test.
    """
    return await asyncio.to_thread(_run_main, list(argv))


def cli_process(*argv: str, timeout: float = 60.0) -> CliResult:
    """Run ``outboxkit ARGV`` as a separate process, as an operator or a cron job would
    (``timeout``: a quiet machine's figure, :func:`~tests.support.waits.scaled` for the load)."""
    began = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", "from outboxkit.cli.main import main; main()", *argv],
        capture_output=True,
        text=True,
        timeout=scaled(timeout),
        env={**os.environ},
        check=False,
    )
    return CliResult(done.returncode, done.stdout, done.stderr, time.monotonic() - began)


async def end_offsets(bootstrap: str, topic: str, partitions: int = 1) -> list[int]:
    """The end offset of each partition of ``topic``."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        ends = await consumer.end_offsets(tps)
    finally:
        await consumer.stop()
    return [ends[tp] for tp in tps]


async def commit_offsets(bootstrap: str, group: str, offsets: dict[TopicPartition, int]) -> None:
    """Commit ``offsets`` for ``group`` without joining it (as a stopped member would have)."""
    # No auto-commit: stopping would commit the position it fetched to, over ``offsets``.
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False
    )
    await consumer.start()
    try:
        consumer.assign(list(offsets))
        await consumer.commit(offsets)
    finally:
        await consumer.stop()
