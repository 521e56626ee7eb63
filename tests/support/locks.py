"""Watching a locked block's server session: the locks it still holds when its script returns."""

from __future__ import annotations

import pytest
from outboxkit.outbox import locked
from sqlalchemy import Engine, text
from sqlalchemy.ext.asyncio import AsyncConnection


def locks_left_by_scripts(
    monkeypatch: pytest.MonkeyPatch, observer: Engine, marker: str
) -> list[int]:
    """A list that, from now on, gets for each locked block's script containing ``marker``
    the number of locks its server session held right after the script returned (read by
    ``observer`` from ``pg_locks``)."""
    counts: list[int] = []
    sent = locked.send_script

    async def counting(
        connection: AsyncConnection, script: str, *, notices: list[str] | None = None
    ) -> str:
        status = await sent(connection, script, notices=notices)
        if marker in script:
            pid = (await connection.get_raw_connection()).driver_connection.get_server_pid()
            with observer.connect() as looking:
                held = looking.scalar(
                    text("SELECT count(*) FROM pg_locks WHERE pid = :pid"),
                    {"pid": pid},
                )
            counts.append(int(held or 0))
        return status

    monkeypatch.setattr(locked, "send_script", counting)
    return counts
