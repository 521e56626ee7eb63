"""Why a Kafka connection or a send failed, in one line an operator can act on, without any
secret; and which failures leave a producer that must be replaced (:func:`producer_lost`).

aiokafka reports every failed bootstrap as ``KafkaConnectionError: Unable to bootstrap from
[...]`` and keeps the cause (a rejected password, an untrusted certificate) in its own log.
:func:`explain` connects once more the same way, with aiokafka's connection class, and names
the cause from the error that connection raises.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from typing import Any

from aiokafka.errors import (
    InvalidProducerEpoch,
    KafkaConnectionError,
    KafkaError,
    KafkaTimeoutError,
    OutOfOrderSequenceNumber,
    ProducerFenced,
    RequestTimedOutError,
    SaslAuthenticationFailed,
    UnknownProducerId,
    UnsupportedSaslMechanismError,
)
from outboxkit.outbox.kafka_settings import KafkaSettings, KafkaSettingsError

_CONNECTION_KEYS = (
    "client_id",
    "ssl_context",
    "security_protocol",
    "sasl_mechanism",
    "sasl_plain_username",
    "sasl_plain_password",
    "sasl_oauth_token_provider",
)


# The producer's idempotence state (its producer id, epoch and per-partition sequence numbers)
# no longer matches the brokers': retried in place, the send fails for ever (aiokafka#1017: after
# a short outage OutOfOrderSequenceNumber stops production until a restart). Only a new producer,
# with a new producer id, publishes again.
_STATE_LOST: tuple[tuple[type[BaseException], str], ...] = (
    (OutOfOrderSequenceNumber, "out-of-order sequence number"),
    (UnknownProducerId, "unknown producer id"),
    (InvalidProducerEpoch, "fenced producer (invalid epoch)"),
    (ProducerFenced, "fenced producer"),
)
# No answer in time: the send's outcome is unknown (written or not), so the producer's sequence
# numbers may be wrong too (Jepsen: re-initialise the producer after indefinite errors).
_INDEFINITE = (KafkaTimeoutError, RequestTimedOutError, TimeoutError)


def producer_lost(error: BaseException) -> str | None:
    """Why ``error`` leaves a producer that cannot be trusted to send again, in a few words
    (its idempotence state is lost, or a send's outcome is unknown); ``None`` for a failure
    after which the same producer may retry (a broker that cannot be reached, say)."""
    for kind, cause in _STATE_LOST:
        if isinstance(error, kind):
            return cause
    if isinstance(error, _INDEFINITE):
        return "no acknowledgement in time (outcome unknown)"
    return None


def hosts(bootstrap: str) -> list[tuple[str, int]]:
    """``host:port`` pairs of a bootstrap string (port 9092 when left out)."""
    pairs = []
    for item in bootstrap.split(","):
        item = item.strip()
        if not item:
            continue
        host, _, port = item.rpartition(":")
        if not port.isdigit():
            host, port = item, "9092"
        pairs.append((host.strip("[]"), int(port)))
    return pairs


async def probe(settings: KafkaSettings, timeout_s: float = 10.0) -> str | None:
    """Connect to each bootstrap server (TLS handshake, API versions, SASL) as aiokafka does;
    return the first failure as one line, or ``None`` when a server accepts the connection."""
    from aiokafka.conn import create_conn

    try:
        options = settings.client_options("outboxkit-probe")
    except KafkaSettingsError as error:
        return str(error)
    connection_options: dict[str, Any] = {
        key: options[key] for key in _CONNECTION_KEYS if key in options
    }
    first: str | None = None
    for host, port in hosts(settings.bootstrap):
        try:
            async with asyncio.timeout(timeout_s):
                connection = await create_conn(
                    host,
                    port,
                    request_timeout_ms=max(1000, int(timeout_s * 1000)),
                    **connection_options,
                )
        except (OSError, KafkaError, TimeoutError, ssl.SSLError) as error:
            first = first or describe(error, host, port, settings, timeout_s)
            continue
        connection.close()
        return None
    return first


async def explain(settings: KafkaSettings, error: BaseException, timeout_s: float = 10.0) -> str:
    """``error`` of an aiokafka client as one line naming the cause: for a failed bootstrap,
    what :func:`probe` finds; otherwise the error's own text (secrets masked)."""
    if isinstance(error, KafkaConnectionError | TimeoutError | OSError):
        found = await probe(settings, timeout_s)
        if found is not None:
            return found
    return mask(
        f"{type(error).__name__}: {error}" if str(error) else type(error).__name__, settings
    )


def describe(
    error: BaseException, host: str, port: int, settings: KafkaSettings, timeout_s: float
) -> str:
    """One line naming why connecting to ``host:port`` failed with ``error``; text taken from
    the error itself has the secrets of ``settings`` masked."""
    where = f"{host}:{port}"
    if isinstance(error, ssl.SSLCertVerificationError):
        detail = mask(error.verify_message or str(error.reason), settings)
        if "mismatch" in detail.lower():
            return (
                f"TLS hostname mismatch: the certificate of {where} is not valid for {host!r} "
                f"({detail}); connect by a name in the certificate"
            )
        return (
            f"TLS certificate verify failed: {where} presented a certificate that is not "
            f"trusted ({detail}); check ssl_cafile"
        )
    if isinstance(error, SaslAuthenticationFailed):
        return (
            f"SASL authentication failed at {where} for user {settings.sasl_username!r} "
            f"({settings.sasl_mechanism}): wrong username or password"
        )
    if isinstance(error, UnsupportedSaslMechanismError):
        return f"SASL mechanism {settings.sasl_mechanism} is not enabled at {where}"
    if isinstance(error, ssl.SSLError):
        hint = ""
        if "WRONG_VERSION" in str(error) or "record layer" in str(error):
            hint = " (is the listener TLS? check security_protocol)"
        return (
            f"TLS handshake with {where} failed: {mask(str(error.reason or error), settings)}{hint}"
        )
    if isinstance(error, ConnectionRefusedError):
        return f"connection refused by {where} (no broker listens there)"
    if isinstance(error, socket.gaierror):
        return f"cannot resolve {host!r}: {error.strerror}"
    if isinstance(error, TimeoutError):
        return (
            f"no answer from {where} within {timeout_s:g} s (unreachable, or a TLS listener "
            "spoken to in PLAINTEXT: check security_protocol)"
        )
    if isinstance(error, ConnectionError | KafkaConnectionError):
        return (
            f"{where} closed the connection during the handshake: it refused the client "
            "certificate (mTLS), or security_protocol does not match the listener"
        )
    return f"connecting to {where}: {type(error).__name__}: {mask(str(error), settings)}"


def mask(text: str, settings: KafkaSettings) -> str:
    """``text`` with every secret of ``settings`` replaced by ``***``, on one line."""
    line = " ".join(text.split())
    for secret in settings.secrets():
        if secret:
            line = line.replace(secret, "***")
    return line
