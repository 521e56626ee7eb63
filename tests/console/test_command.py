"""``outboxkit console``: refuses to start open to anyone, and serves as a process."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import httpx
import pytest

from tests.support.console import free_port
from tests.support.ops import cli


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "no tokens: give --tokens-file or OUTBOXKIT_CONSOLE_TOKENS"),
        (("--insecure-no-auth", "--host", "0.0.0.0"), "--insecure-no-auth serves a loopback"),
    ],
)
async def test_the_console_refuses_to_start_open(args: tuple[str, ...], message: str) -> None:
    os.environ.pop("OUTBOXKIT_CONSOLE_TOKENS", None)
    result = await cli("console", *args, "--db-url", "sqlite:///nowhere.db")
    assert result.code == 2
    assert message in result.error_line()


async def test_a_bad_tokens_file_is_one_line(tmp_path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("a-secret-token-123456 admin bob\n")
    result = await cli("console", "--tokens-file", str(tokens), "--db-url", "sqlite:///x.db")
    assert result.code == 2
    assert "line 1: expected TOKEN ROLE NAME" in result.error_line()
    assert "a-secret-token-123456" not in result.err


def test_the_command_serves_the_console(pg_url: str, kafka_bootstrap: str) -> None:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-c", "from outboxkit.cli.main import main; main()", "console",
         "--insecure-no-auth", "--port", str(port), "--db-url", pg_url,
         "--bootstrap", kafka_bootstrap],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 180
        while True:
            assert process.poll() is None, process.communicate()
            try:
                response = httpx.get(f"http://127.0.0.1:{port}/outbox", timeout=30)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "the console did not answer in 180 s"
                time.sleep(0.2)
        assert response.status_code == 200
        assert "anonymous (operator)" in response.text
    finally:
        process.terminate()
        process.wait(30)
