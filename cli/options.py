"""What the commands share: the common options, settings from flags and environment, and the
one parser of durations and times that every command uses."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

import typer
from outboxkit.cli.errors import CliError
from outboxkit.ops.access import DEFAULT_TIMEOUT_S
from outboxkit.outbox.settings import Settings

DbUrlOption = typer.Option(None, "--db-url", help="Database URL [env: OUTBOXKIT_DB_URL].")
BootstrapOption = typer.Option(
    None, "--bootstrap", help="Kafka bootstrap servers [env: OUTBOXKIT_KAFKA_BOOTSTRAP]."
)
TimeoutOption = typer.Option(
    DEFAULT_TIMEOUT_S,
    "--timeout",
    min=0.1,
    help="Seconds to wait for Kafka or the database before giving up.",
)
JsonOption = typer.Option(False, "--json", help="Print JSON for scripts.")

_DURATION = re.compile(r"^(\d+)(ms|s|m|h|d|w)$")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}


def settings_from(db_url: str | None = None, kafka_bootstrap: str | None = None) -> Settings:
    """Settings from the environment, overridden by the flags that were given."""
    given = {"db_url": db_url, "kafka_bootstrap": kafka_bootstrap}
    overrides: dict[str, Any] = {k: v for k, v in given.items() if v is not None}
    return Settings(**overrides)


def parse_duration_ms(text: str, option: str = "duration") -> int:
    """``500ms``, ``30s``, ``10m``, ``2h``, ``1d``, ``1w`` in ms; a one-line error if not."""
    match = _DURATION.match(text.strip())
    if match is None:
        raise CliError(f"{option}: invalid duration {text!r}: use e.g. 500ms, 30s, 10m, 2h or 1d")
    return int(match.group(1)) * _UNIT_MS[match.group(2)]


def parse_time(text: str, now_ms: int, option: str) -> int:
    """Epoch ms of ``text``: ISO-8601 (naive means UTC) or an age like ``2h`` (that long ago)."""
    value = text.strip()
    if _DURATION.match(value):
        return now_ms - parse_duration_ms(value, option)
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise CliError(
            f"{option}: cannot read {text!r} as a time: use ISO-8601 "
            "(2026-11-30T09:00:00Z) or an age such as 90s, 15m, 2h, 7d"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)
