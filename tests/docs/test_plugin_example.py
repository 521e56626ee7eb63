"""docs/testing.md's plugin example, run as its own pytest session under pytest-asyncio's
strict mode (the default) and auto mode, against the real broker and a SQLite file."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "testing.md"


def plugin_example() -> str:
    text = DOC.read_text(encoding="utf-8")
    match = re.search(
        r"<!-- example: tests/docs/test_plugin_example.py -->\n```python\n(.*?)```", text, re.S
    )
    assert match, "docs/testing.md lost its plugin example"
    return match.group(1)


@pytest.mark.parametrize("mode", ["strict", "auto"])
def test_the_plugin_example_passes(mode: str, kafka_bootstrap: str, tmp_path: Path) -> None:
    body = plugin_example()
    line = 'pytest_plugins = ["outboxkit.testing.pytest_plugin"]  # in conftest.py\n'
    assert line in body
    (tmp_path / "conftest.py").write_text(line)
    (tmp_path / "test_example.py").write_text(body.replace(line, ""))
    env = {**os.environ, "OUTBOXKIT_KAFKA_BOOTSTRAP": kafka_bootstrap}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-o",
            f"asyncio_mode={mode}",
            "--rootdir",
            str(tmp_path),
            str(tmp_path),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "1 passed" in done.stdout, done.stdout
