"""Small defects of issue 23 in the kernel: a bytes extension's wire form, and a client key's
passphrase that must never make OpenSSL prompt."""

from __future__ import annotations

import base64
import json
import os
import pty
import select
import sys
import time
from pathlib import Path

from cloudevents.core.v1.event import CloudEvent
from outboxkit.outbox import Outbox
from outboxkit.outbox.db import make_engine
from outboxkit.outbox.tables import outbox_events
from outboxkit.testing.certificates import make_certificates
from sqlalchemy import select as sql_select
from sqlalchemy.orm import Session


def test_a_bytes_extension_of_an_sdk_event_is_stored_as_base64(sqlite_url: str) -> None:
    """CloudEvents type system: a Binary attribute's string form is base64, not ``b'...'``."""
    raw = b"\xfb\x00\x01binary"
    event = CloudEvent(
        {"type": "t", "source": "/s", "id": "e-1", "specversion": "1.0", "bin": raw}, None
    )
    engine = make_engine(sqlite_url)
    with Session(engine) as session, session.begin():
        Outbox(default_topic="orders").add(session, event)
    with engine.connect() as connection:
        stored = connection.execute(sql_select(outbox_events.c.headers)).scalar_one()
    engine.dispose()
    headers = dict(json.loads(stored))
    assert headers["ce_bin"] == base64.b64encode(raw).decode()
    assert base64.b64decode(headers["ce_bin"]) == raw


PROBE = """
import sys
from pathlib import Path
from outboxkit.outbox.kafka_settings import KafkaSettings, KafkaSettingsError
settings = KafkaSettings(
    security_protocol="SSL",
    ssl_cafile=Path(sys.argv[1]),
    ssl_certfile=Path(sys.argv[2]),
    ssl_keyfile=Path(sys.argv[3]),
)
try:
    settings.ssl_context()
except KafkaSettingsError as error:
    print("refused:", error, flush=True)
"""


def test_an_encrypted_client_key_without_passphrase_is_an_error_not_a_prompt(
    tmp_path: Path,
) -> None:
    """On a terminal, OpenSSL asks for the passphrase of an encrypted key when given none: the
    process would stop and wait. Run in a pseudo-terminal, it must fail at once instead."""
    files = make_certificates(tmp_path)
    args = [str(files.ca_file), str(files.client_cert), str(files.client_key)]
    pid, fd = pty.fork()
    if pid == 0:  # the child, with the pty as its controlling terminal
        os.execv(sys.executable, [sys.executable, "-c", PROBE, *args])
    output = b""
    deadline = time.monotonic() + 60
    try:
        # Read until the child exits (EOF on the pty); a prompt would wait for ever instead.
        while time.monotonic() < deadline and b"pass phrase" not in output.lower():
            ready, _, _ = select.select([fd], [], [], 1.0)
            if ready:
                try:
                    chunk = os.read(fd, 4096)
                except OSError:
                    break
                if not chunk:
                    break
                output += chunk
    finally:
        if not _reaped(pid):
            os.kill(pid, 9)
            os.waitpid(pid, 0)
        os.close(fd)
    text = output.decode(errors="replace")
    assert "pass phrase" not in text.lower(), text
    assert "refused:" in text and "ssl_key_password" in text, text


def _reaped(pid: int) -> bool:
    done, _ = os.waitpid(pid, os.WNOHANG)
    return done == pid


def test_the_configured_passphrase_still_opens_the_key(tmp_path: Path) -> None:
    files = make_certificates(tmp_path)
    from outboxkit.outbox.kafka_settings import KafkaSettings
    from pydantic import SecretStr

    KafkaSettings(
        security_protocol="SSL",
        ssl_cafile=files.ca_file,
        ssl_certfile=files.client_cert,
        ssl_keyfile=files.client_key,
        ssl_key_password=SecretStr(files.client_key_password),
    ).ssl_context()


def test_every_failure_class_fits_its_column() -> None:
    """``failure_class`` is ``String(16)``: PostgreSQL refuses a longer value, SQLite stores it.
    The values come from :class:`FailureClass` only (``classify``), so the guard is here: a
    new, longer class fails this test instead of failing on PostgreSQL in production."""
    from outboxkit.workflows.failures import FailureClass
    from outboxkit.workflows.tables import workflow_instances

    length = workflow_instances.c.failure_class.type.length
    assert all(len(value) <= length for value in FailureClass), [
        value for value in FailureClass if len(value) > length
    ]
