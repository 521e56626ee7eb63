"""A dead letter's bytes for a person: header values and the data as text, JSON or a hex dump.

``outboxkit dlq show`` and the console's letter page render a record through these.
"""

from __future__ import annotations

import json

from outboxkit.consumers.decoding import STRUCTURED_PREFIX, is_json_content_type
from outboxkit.outbox.secrecy import REDACTED, is_secret_key, redact


def header_value(value: bytes | None) -> str | None:
    """A header value (or key) as UTF-8 text, or a capped hex dump when it is not text."""
    if value is None:
        return None
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return "0x" + value[:64].hex() + ("..." if len(value) > 64 else "")


def shown_header(name: str, value: bytes | None) -> str | None:
    """A header's value as :func:`header_value` renders it, ``"[redacted]"`` when its name
    says it is a secret (a CloudEvents extension ``ce_authtoken``, an ``authorization``)."""
    if value is not None and is_secret_key(name.removeprefix("ce_")):
        return REDACTED
    return header_value(value)


def int_or_none(value: bytes | None) -> int | None:
    """A header value as a decimal integer, or ``None``."""
    try:
        return int(value or b"")
    except ValueError:
        return None


def render_data(value: bytes | None, content_type: str | None, max_bytes: int) -> tuple[str, bool]:
    """The data as pretty JSON (secret fields redacted), text or a hex dump, cut to
    ``max_bytes``; and whether it was cut."""
    if value is None:
        return "(no value)", False
    if not value:
        return "(empty)", False
    structured = (content_type or "").strip().lower().startswith(STRUCTURED_PREFIX)
    text: str | None = None
    if structured or is_json_content_type(content_type):
        try:
            text = json.dumps(redact(json.loads(value)), indent=2, ensure_ascii=False)
        except (ValueError, UnicodeDecodeError):
            text = None
    if text is None:
        try:
            text = value.decode("utf-8")
        except UnicodeDecodeError:
            return _hex_dump(value, max_bytes)
        if not all(char.isprintable() or char in "\n\r\t" for char in text):
            return _hex_dump(value, max_bytes)  # control bytes would garble the terminal
    encoded = text.encode("utf-8")
    if len(encoded) <= max_bytes:
        return text, False
    return encoded[:max_bytes].decode("utf-8", "ignore"), True


def _hex_dump(value: bytes, max_bytes: int) -> tuple[str, bool]:
    # 16 source bytes make a 76-byte line; cap the source so the dump fits max_bytes.
    shown = value[: max(16, max_bytes // 76 * 16)]
    lines = []
    for start in range(0, len(shown), 16):
        chunk = shown[start : start + 16]
        printable = "".join(chr(b) if 32 <= b < 127 else "." for b in chunk)
        lines.append(f"{start:08x}  {chunk.hex(' '):<47}  {printable}")
    return "\n".join(lines), len(shown) < len(value)
