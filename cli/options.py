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
TimeoutOption = typer.Option(
    DEFAULT_TIMEOUT_S,
    "--timeout",
    min=0.1,
    help="Seconds to wait for Kafka or the database before giving up.",
)
JsonOption = typer.Option(False, "--json", help="Print JSON for scripts.")

_DURATION = re.compile(r"^(\d+)(ms|s|m|h|d|w)$")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}


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
