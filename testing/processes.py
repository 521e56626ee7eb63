"""Starting and stopping outboxkit CLI processes, for tests and benchmarks."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path


def start_cli(
    args: list[str], log_path: Path, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start ``outboxkit ARGS`` as a child process logging to ``log_path``."""
    log = open(log_path, "ab")  # noqa: SIM115 - the child writes to it
    try:
        return subprocess.Popen(
            [sys.executable, "-c", "from outboxkit.cli.main import main; main()", *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
        )
    finally:
        log.close()


def terminate(process: subprocess.Popen[bytes], timeout: float = 30.0) -> int:
    """SIGTERM and wait; returns the exit code (SIGKILL if it does not stop in time)."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    return process.returncode


def kill(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL, as a crash would."""
    process.kill()
    process.wait()
