"""What the commands share: the common options, settings from flags and environment, and the
one parser of durations and times that every command uses."""

from __future__ import annotations

import importlib
import os
import re
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import typer
from outboxkit.cli.errors import CliError
from outboxkit.ops.access import DEFAULT_TIMEOUT_S
from outboxkit.outbox.kafka_settings import KafkaSettings
from outboxkit.outbox.settings import Settings

DbUrlOption = typer.Option(None, "--db-url", help="Database URL [env: OUTBOXKIT_DB_URL].")
# Kafka connection flags, the same on every command that talks to Kafka. Secrets (the SASL
# password, the key passphrase) have no flag: a command line is visible to every local user.
BootstrapOption = typer.Option(
    None, "--bootstrap", help="Kafka bootstrap servers [env: OUTBOXKIT_KAFKA_BOOTSTRAP]."
)
SecurityProtocolOption = typer.Option(
    None,
    "--security-protocol",
    help="PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL [env: OUTBOXKIT_KAFKA_SECURITY_PROTOCOL].",
)
SaslMechanismOption = typer.Option(
    None,
    "--sasl-mechanism",
    help="PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 or OAUTHBEARER "
    "[env: OUTBOXKIT_KAFKA_SASL_MECHANISM]; the password: OUTBOXKIT_KAFKA_SASL_PASSWORD.",
)
SaslUsernameOption = typer.Option(
    None, "--sasl-username", help="SASL user [env: OUTBOXKIT_KAFKA_SASL_USERNAME]."
)
SslCafileOption = typer.Option(
    None, "--ssl-cafile", help="CA certificates (PEM) to trust [env: OUTBOXKIT_KAFKA_SSL_CAFILE]."
)
SslCertfileOption = typer.Option(
    None,
    "--ssl-certfile",
    help="Client certificate (PEM) for mTLS [env: OUTBOXKIT_KAFKA_SSL_CERTFILE].",
)
SslKeyfileOption = typer.Option(
    None,
    "--ssl-keyfile",
    help="Client key (PEM) for mTLS [env: OUTBOXKIT_KAFKA_SSL_KEYFILE]; its passphrase: "
    "OUTBOXKIT_KAFKA_SSL_KEY_PASSWORD.",
)
JsonOption = typer.Option(False, "--json", help="Print JSON for scripts.")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
# The logging flags of the long-running commands (relay, consume, workflows run).


def _log_level(value: str) -> str:
    level = str(value).strip().upper()
    if level not in LOG_LEVELS:
        raise typer.BadParameter(f"{value!r} is not one of {', '.join(LOG_LEVELS)}")
    return level


LogLevelOption = typer.Option(
    "INFO", "--log-level", parser=_log_level, help="DEBUG, INFO, WARNING or ERROR."
)
JsonLogsOption = typer.Option(False, "--json-logs", help="Log one JSON object per line.")

# The one duration syntax of every flag: a number with a unit, or a bare number of seconds.
_DURATION = re.compile(r"^(\d+(?:\.\d+)?|\.\d+)\s*(ms|s|m|h|d|w)?$")
# An age in a time flag (--since 2h) needs its unit: a bare number there could be a timestamp.
_AGE = re.compile(r"^(\d+)(ms|s|m|h|d|w)$")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}
DURATION_HELP = "500ms, 5s, 2m, 1h, 1d, or a bare number of seconds"


def settings_from(db_url: str | None = None) -> Settings:
    """Settings from the flags given, then the environment, then the config file."""
    given = {"db_url": db_url}
    overrides: dict[str, Any] = {k: v for k, v in given.items() if v is not None}
    return Settings(**overrides)


def kafka_from(
    bootstrap: str | None = None,
    security_protocol: str | None = None,
    sasl_mechanism: str | None = None,
    sasl_username: str | None = None,
    ssl_cafile: Path | None = None,
    ssl_certfile: Path | None = None,
    ssl_keyfile: Path | None = None,
) -> KafkaSettings:
    """Kafka settings from the flags given, then ``OUTBOXKIT_KAFKA_*``, then the config file;
    a missing or contradictory setting is one line and exit 2."""
    return KafkaSettings.load(
        bootstrap=bootstrap,
        security_protocol=security_protocol,
        sasl_mechanism=sasl_mechanism,
        sasl_username=sasl_username,
        ssl_cafile=ssl_cafile,
        ssl_certfile=ssl_certfile,
        ssl_keyfile=ssl_keyfile,
    )


def parse_duration_ms(text: str, option: str = "duration") -> int:
    """``500ms``, ``30s``, ``10m``, ``2h``, ``1d``, ``1w`` or a bare number of seconds (``5``,
    ``0.5``), in whole milliseconds; a one-line :class:`CliError` if not."""
    match = _DURATION.match(text.strip().lower())
    if match is None:
        raise CliError(f"{option}: {text!r} is not a duration: use {DURATION_HELP}")
    return round(float(match.group(1)) * _UNIT_MS[match.group(2) or "s"])


class Duration:
    """The parser of every duration flag: :func:`parse_duration_ms`'s syntax, given to the
    command as float seconds, at least ``minimum_s``; a bad value is click's usage error."""

    __name__ = "duration"  # click names the type after its converter

    def __init__(self, minimum_s: float | None = None) -> None:
        self.minimum_s = minimum_s

    def __call__(self, value: Any) -> float:
        """Seconds of ``value`` (a default may already be a number of seconds)."""
        if isinstance(value, int | float):
            seconds = float(value)
        else:
            match = _DURATION.match(str(value).strip().lower())
            if match is None:
                raise typer.BadParameter(f"{value!r} is not a duration: use {DURATION_HELP}")
            seconds = round(float(match.group(1)) * _UNIT_MS[match.group(2) or "s"]) / 1000
        if self.minimum_s is not None and seconds < self.minimum_s:
            raise typer.BadParameter(f"{value} is below the least allowed, {self.minimum_s:g}s")
        return seconds


def duration_option(
    default: float | None, *names: str, help: str, minimum_s: float | None = None, **kw: Any
) -> Any:
    """A flag taking a duration (:class:`Duration`), given to the command as float seconds."""
    shown = None if default is None else duration_text(default)  # --help shows it as given
    return typer.Option(
        shown, *names, parser=Duration(minimum_s), metavar="DURATION", help=help, **kw
    )


def duration_text(seconds: float) -> str:
    """``seconds`` in the duration syntax, in the largest unit that keeps it whole (``7d``)."""
    ms = round(seconds * 1000)
    for unit in ("d", "h", "m", "s"):
        if ms and ms % _UNIT_MS[unit] == 0:
            return f"{ms // _UNIT_MS[unit]}{unit}"
    return f"{ms}ms"


TimeoutOption = duration_option(
    DEFAULT_TIMEOUT_S,
    "--timeout",
    minimum_s=0.1,
    help="How long to wait for Kafka or the database before giving up (5s, 500ms, 2m).",
)


def parse_time(text: str, now_ms: int, option: str) -> int:
    """Epoch ms of ``text``: ISO-8601 (naive means UTC) or an age like ``2h`` (that long ago)."""
    value = text.strip()
    if _AGE.match(value):
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


def import_target(target: str, metavar: str, example: str) -> Any:
    """Import ``module:attribute`` (``metavar`` in messages) and return the object it names.

    The current directory is importable, as with ``python -m``. A malformed target, a module
    that does not import or a missing attribute is one :class:`CliError` line.
    """
    module_name, sep, attribute = target.partition(":")
    if not sep or not module_name or not attribute:
        raise CliError(f"expected {metavar} (e.g. {example}), got {target!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise CliError(f"cannot import module {module_name!r}: {error}") from None
    found: Any = module
    for part in attribute.split("."):
        found = getattr(found, part, _MISSING)  # once: a module __getattr__ may build it
        if found is _MISSING:
            raise CliError(f"module {module_name!r} has no attribute {attribute!r}")
    return found


_MISSING = object()
