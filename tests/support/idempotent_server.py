"""The test service as a uvicorn target (``tests.support.idempotent_server:app``), from the
environment: ``OUTBOXKIT_DB_URL``, ``IDEM_TOPIC``, ``IDEM_LEASE_S``, ``IDEM_HOLD_FILE`` (the
handler waits while it exists) and ``IDEM_REACHED_FILE`` (touched when the handler runs)."""

from __future__ import annotations

import os
from pathlib import Path

from outboxkit.outbox.db import make_async_engine

from tests.support.idempotent_app import Controls, build_app

app = build_app(
    make_async_engine(os.environ["OUTBOXKIT_DB_URL"]),
    topic=os.environ.get("IDEM_TOPIC", "test.payments"),
    controls=Controls(
        hold_file=Path(os.environ["IDEM_HOLD_FILE"]) if "IDEM_HOLD_FILE" in os.environ else None,
        reached_file=Path(os.environ["IDEM_REACHED_FILE"])
        if "IDEM_REACHED_FILE" in os.environ
        else None,
    ),
    lease_s=float(os.environ.get("IDEM_LEASE_S", "30")),
)
