"""Reading the ``Idempotency-Key`` header: a Structured Fields string (IETF draft) or a bare token.

The draft sends the key as an sf-string (``Idempotency-Key: "8e03978e-..."``); most clients,
Stripe's among them, send it bare. Both are accepted and mean the same key.
"""

from __future__ import annotations

HEADER = "idempotency-key"
MAX_KEY_LENGTH = 255


class InvalidKeyError(ValueError):
    """The header is present but is not a usable key (the message says why, never the key)."""

    outboxkit_safe_message = True  # its messages are written by outboxkit (outbox/secrecy.py)


def parse_key(raw: str) -> str:
    """The key of a header value; raises :class:`InvalidKeyError` if it is not one."""
    value = raw.strip(" \t")
    if value.startswith('"'):
        value = _sf_string(value)
    elif any(not "\x21" <= char <= "\x7e" for char in value):
        raise InvalidKeyError("a bare Idempotency-Key must be visible ASCII without spaces")
    if not value.strip():
        raise InvalidKeyError("the Idempotency-Key is empty")
    if len(value) > MAX_KEY_LENGTH:
        raise InvalidKeyError(f"the Idempotency-Key is longer than {MAX_KEY_LENGTH} characters")
    return value


def _sf_string(value: str) -> str:
    """RFC 8941 string: DQUOTE *(unescaped / "\\" ( DQUOTE / "\\" )) DQUOTE, printable ASCII."""
    chars: list[str] = []
    index = 1
    while index < len(value):
        char = value[index]
        if char == "\\":
            if index + 1 >= len(value) or value[index + 1] not in '"\\':
                raise InvalidKeyError("the Idempotency-Key string has a bad escape")
            chars.append(value[index + 1])
            index += 2
            continue
        if char == '"':
            if index != len(value) - 1:
                raise InvalidKeyError("the Idempotency-Key string has text after its end")
            return "".join(chars)
        if not "\x20" <= char <= "\x7e":
            raise InvalidKeyError("the Idempotency-Key string must be printable ASCII")
        chars.append(char)
        index += 1
    raise InvalidKeyError("the Idempotency-Key string is not closed")
