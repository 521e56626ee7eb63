"""The README's quick start runs end to end and shows what it promises."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support import REPO
from tests.support.waits import scaled


def test_quickstart_shows_the_whole_pipeline(kafka_bootstrap: str, tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "examples.quickstart"],
        cwd=tmp_path,
        env={**os.environ, "OUTBOXKIT_KAFKA_BOOTSTRAP": kafka_bootstrap, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=scaled(240),
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert "orders in the database: 3; events waiting in the outbox: 3" in out
    assert "relay published 3 events" in out
    assert out.count("type=shop.order.placed") == 3
    assert "billing consumer applied 3 events: 3 invoices" in out
    assert "skipped by the inbox (duplicates=1); invoices still 3" in out
