"""A workflow worker process running the test ``refund`` workflow, for crash tests.

``python -m tests.support.workflow_worker --db-url URL [--lease S] [--action-lease S]`` runs a
:class:`~outboxkit.workflows.WorkflowWorker` over :func:`tests.support.workflows.build` (v1)
until SIGTERM (graceful) or SIGKILL (the crash a test inflicts). Short leases let another
worker take over within seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

from outboxkit.outbox.logs import configure_logging
from outboxkit.workflows import WorkflowWorker

from tests.support.actions import sessions_for
from tests.support.waits import scaled
from tests.support.workflows import build, make_engine

ROOT = Path(__file__).resolve().parents[2]


def start(
    db_url: str, *, lease_s: float, action_lease_s: float, log: Path | None = None
) -> subprocess.Popen[bytes]:
    """Start this module as a child process (output to ``log``, or a pipe)."""
    output = open(log, "ab") if log is not None else subprocess.PIPE  # noqa: SIM115
    try:
        return subprocess.Popen(
            [
                *(sys.executable, "-m", "tests.support.workflow_worker", "--db-url", db_url),
                *("--lease", str(lease_s), "--action-lease", str(action_lease_s)),
            ],
            cwd=ROOT,
            stdout=output,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
    finally:
        if log is not None:
            output.close()  # type: ignore[union-attr]


def stop(worker: subprocess.Popen[bytes]) -> None:
    """SIGTERM ``worker`` and wait for it (SIGKILL if it does not stop)."""
    if worker.poll() is None:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(scaled(30))
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait(scaled(30))
    if worker.stdout is not None:
        worker.stdout.close()


async def serve(db_url: str, lease_s: float, action_lease_s: float) -> None:
    """Run one worker until SIGTERM."""
    async with sessions_for(db_url) as sessions:
        engine = make_engine(sessions, [build(1)], lease_s=lease_s, action_lease_s=action_lease_s)
        worker = WorkflowWorker(engine, poll_interval_s=0.2)
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, lambda: loop.create_task(worker.stop()))
        print(f"workflow_worker {os.getpid()}: running", flush=True)
        await worker.run()


def main() -> None:
    """Parse the arguments and work until stopped."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--db-url", required=True)
    parser.add_argument("--lease", type=float, default=3.0, help="instance lease, seconds")
    parser.add_argument("--action-lease", type=float, default=2.0, help="effect lease, seconds")
    args = parser.parse_args()
    configure_logging("INFO")
    asyncio.run(serve(args.db_url, args.lease, args.action_lease))


if __name__ == "__main__":
    main()
