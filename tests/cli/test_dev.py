"""``outboxkit dev kafka`` fails honestly: without Java or Maven, on a busy port, or when its
broker dies after start, one line on stderr and exit 2, and never ``ready:`` for a broker that
is not serving. Real processes and a real broker."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from outboxkit.testing.processes import terminate

from tests.support.kafka import wait_for
from tests.support.waits import scaled

CLI = [sys.executable, "-c", "from outboxkit.cli.main import main; main()", "dev", "kafka"]


def run_dev_kafka(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args], env=env, capture_output=True, text=True, timeout=240, check=False
    )


def assert_one_line_exit_2(result: subprocess.CompletedProcess[str], says: str) -> None:
    assert result.returncode == 2, result.stderr
    assert "ready:" not in result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert says in lines[0]


def test_without_java_it_says_so_in_one_line(tmp_path: Path) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    env = {**os.environ, "PATH": str(empty), "OUTBOXKIT_CACHE": str(tmp_path / "cache")}
    assert_one_line_exit_2(run_dev_kafka([], env), "java is not installed")


@pytest.mark.skipif(shutil.which("java") is None, reason="needs java")
def test_without_maven_and_no_cached_jars_it_says_so_in_one_line(tmp_path: Path) -> None:
    only_java = tmp_path / "bin"
    only_java.mkdir()
    (only_java / "java").symlink_to(os.path.realpath(shutil.which("java") or "java"))
    env = {**os.environ, "PATH": str(only_java), "OUTBOXKIT_CACHE": str(tmp_path / "cache")}
    assert_one_line_exit_2(run_dev_kafka([], env), "mvn is not installed")


def test_on_a_port_held_by_another_server_it_refuses(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        result = run_dev_kafka(["--port", str(port)], dict(os.environ))
    assert_one_line_exit_2(result, f"port {port} on 127.0.0.1 is already in use")


def test_on_the_port_of_a_running_broker_it_never_says_ready(kafka_bootstrap: str) -> None:
    # Before: the other broker answered the readiness probe, so `ready:` was printed while
    # the command's own broker had died on the bound port.
    port = kafka_bootstrap.rsplit(":", 1)[1]
    result = run_dev_kafka(["--port", port], dict(os.environ))
    assert_one_line_exit_2(result, f"port {port} on 127.0.0.1 is already in use")


def _java_children(pid: int) -> list[int]:
    found = []
    for children in Path(f"/proc/{pid}/task").glob("*/children"):
        for child in children.read_text().split():
            if b"kafka.Kafka" in Path(f"/proc/{child}/cmdline").read_bytes():
                found.append(int(child))
    return found


@pytest.mark.integration
@pytest.mark.skipif(shutil.which("java") is None, reason="needs java")
@pytest.mark.timeout(240)
async def test_a_broker_that_dies_after_start_ends_the_command_with_exit_2(
    tmp_path: Path,
) -> None:
    out, err = tmp_path / "out.log", tmp_path / "err.log"
    with out.open("wb") as stdout, err.open("wb") as stderr:
        process = subprocess.Popen(CLI, stdout=stdout, stderr=stderr)
    try:
        await wait_for(
            lambda: (out.read_text(), process.poll()),
            lambda seen: "ready:" in seen[0] or seen[1] is not None,
            180,
            "dev kafka ready",
        )
        assert "ready:" in out.read_text(), err.read_text()
        (broker,) = _java_children(process.pid)
        os.kill(broker, signal.SIGKILL)
        await wait_for(process.poll, lambda code: code is not None, 60, "dev kafka to exit")
    finally:
        terminate(process)
    assert process.returncode == 2, err.read_text()
    lines = err.read_text().strip().splitlines()
    assert len(lines) == 1 and "the broker exited with -9" in lines[0], lines


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--brokers", "2"], "2 brokers: give 1 or 3"),
        (["--brokers", "3", "--security", "ssl"], "--security works with one broker only"),
        (["--brokers", "3", "--port", "65534"], "out of range"),
    ],
)
def test_a_cluster_it_cannot_make_is_refused_in_one_line(args: list[str], says: str) -> None:
    assert_one_line_exit_2(run_dev_kafka(args, dict(os.environ)), says)


@pytest.mark.integration
@pytest.mark.skipif(shutil.which("java") is None, reason="needs java")
@pytest.mark.timeout(scaled(240))
async def test_a_three_node_cluster_restarts_a_killed_node_and_stops_on_sigterm(
    tmp_path: Path,
) -> None:
    out, err = tmp_path / "out.log", tmp_path / "err.log"
    with out.open("wb") as stdout, err.open("wb") as stderr:
        process = subprocess.Popen([*CLI, "--brokers", "3"], stdout=stdout, stderr=stderr)
    try:
        await wait_for(
            lambda: (out.read_text(), process.poll()),
            lambda seen: "started in" in seen[0] or seen[1] is not None,
            120,
            "dev kafka --brokers 3 ready",
        )
        text = out.read_text()
        (bootstrap,) = re.findall(r"^ready: (\S+)$", text, re.M)
        assert len(bootstrap.split(",")) == 3
        nodes = dict(re.findall(r"^node (\d): \S+ pid (\d+)", text, re.M))
        assert sorted(nodes) == ["1", "2", "3"]
        assert sorted(_java_children(process.pid)) == sorted(map(int, nodes.values()))
        assert "replication factor 3, min.insync.replicas 2" in text
        os.kill(int(nodes["2"]), signal.SIGKILL)  # a crash, tried by hand
        await wait_for(
            out.read_text, lambda seen: "(restarted)" in seen, 120, "node 2 started again"
        )
        assert "node 2 exited with -9; starting it again" in err.read_text()
        assert process.poll() is None
    finally:
        code = terminate(process)
    assert code == 0, err.read_text()
    restarted = re.findall(r"^node 2: \S+ pid (\d+) \(restarted\)", out.read_text(), re.M)
    for pid in [*nodes.values(), *restarted]:  # every node, the restarted one too, ended
        assert (
            not Path(f"/proc/{pid}").exists()
            or b"kafka" not in Path(f"/proc/{pid}/cmdline").read_bytes()
        )
