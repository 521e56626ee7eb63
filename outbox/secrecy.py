"""What never leaves the process: the one rule for secret fields, and the one safe describer.

Everything outboxkit writes where an operator or another system reads it (history records and
their events, ``workflows show``, stored signals, ``last_error``, dead-letter headers, logs,
spans) goes through here:

- :func:`redact` replaces the value of every field whose *name* says it is a secret
  (:func:`is_secret_key`: case and separators do not matter, so ``apiKey``, ``api-key`` and
  ``API_KEY`` are one name) or that a definition names (``redact_keys``);
- :func:`describe_error` describes an exception by its class and where it was raised; its
  message is kept only for exception types whose messages are written on purpose
  (:data:`SAFE_MESSAGE_ATTRIBUTE`), since a message like ``invalid literal for int(): 'secret'``
  quotes the data it failed on.
"""

from __future__ import annotations

import re
import traceback
from collections.abc import Iterable
from pathlib import Path
from typing import Any

REDACTED = "[redacted]"
MAX_MESSAGE_CHARS = 300
"""The longest description :func:`describe_error` returns."""

SECRET_WORDS = (
    "secret",
    "token",
    "password",
    "passwd",
    "passphrase",
    "privatekey",
    "apikey",
    "accesskey",
    "credential",
    "authorization",
    "bearer",
    "cookie",
    "sessionid",
    "signature",
    "authsig",
    "cardnumber",
    "creditcard",
)
"""A field is secret when its normalised name contains one of these."""
SECRET_NAMES = frozenset({"pan", "cvv", "cvc", "pin", "sig", "jwt", "auth", "session"})
"""A field is secret when its normalised name is one of these (too short to search for)."""
SAFE_MESSAGE_ATTRIBUTE = "outboxkit_safe_message"
"""A class attribute: ``True`` on an exception type whose messages carry no data (outboxkit's
own errors, and the ones user code raises on purpose to say how a failure is treated)."""


def _safe_library_types() -> tuple[type[BaseException], ...]:
    from aiokafka.errors import KafkaError

    # aiokafka's and the broker's messages name the error and the limit, never a record
    return (KafkaError,)


def message_is_safe(error: BaseException) -> bool:
    """Whether ``error``'s message may be shown: the one place that decides it.

    True for types marked with :data:`SAFE_MESSAGE_ATTRIBUTE` and for aiokafka's errors
    (``KafkaError``); false for every other exception, whose message may quote the data it
    failed on.
    """
    return getattr(type(error), SAFE_MESSAGE_ATTRIBUTE, False) is True or isinstance(
        error, _safe_library_types()
    )


_SEPARATORS = re.compile(r"[\s_\-.:/]+")


def normalise(name: str) -> str:
    """``name`` lower-cased without separators: ``API_KEY``, ``api-key`` and ``apiKey`` agree."""
    return _SEPARATORS.sub("", name).lower()


def is_secret_key(name: str, extra_keys: Iterable[str] = ()) -> bool:
    """Whether a field called ``name`` holds a secret (or is one of ``extra_keys``)."""
    key = normalise(name)
    return (
        key in SECRET_NAMES
        or any(word in key for word in SECRET_WORDS)
        or key in {normalise(extra) for extra in extra_keys}
    )


def redact(value: Any, extra_keys: Iterable[str] = ()) -> Any:
    """``value`` with the values of secret fields replaced by ``"[redacted]"``, recursively.

    ``extra_keys`` are more field names to hide (a workflow definition's personal fields).
    """
    extra = frozenset(normalise(key) for key in extra_keys)
    return _redact(value, extra)


def _redact(value: Any, extra: frozenset[str]) -> Any:
    if isinstance(value, dict):
        return {
            key: REDACTED
            if isinstance(key, str) and (is_secret_key(key) or normalise(key) in extra)
            else _redact(item, extra)
            for key, item in value.items()
        }
    if isinstance(value, list | tuple):
        return [_redact(item, extra) for item in value]
    return value


def describe_error(error: BaseException, *, with_class: bool = False) -> str:
    """A short description of ``error`` that carries no payload and no secret.

    ``with_class``: a safe type's message is preceded by its class (``AuthorizationError:
    ...``), for records that have no other place to name it (workflow history, last_error).

    - types whose messages are safe (:func:`message_is_safe`: outboxkit's own errors,
      ``TransientError``/``PermanentError``/``OutcomeUnknownError`` and the workflow failure
      errors, whose messages their authors write; aiokafka's errors): the message's first
      line (the class where it has none: a dead letter names the class in a header of its
      own);
    - pydantic validation errors: where and what, without the input values;
    - database errors: their class and SQLSTATE (a PostgreSQL message may quote a value);
    - any other exception: its class and where it was raised, the message withheld.

    At most :data:`MAX_MESSAGE_CHARS` characters.
    """
    text = _describe(error)
    name = type(error).__name__
    if with_class and message_is_safe(error) and name not in text:
        text = f"{name}: {text}"
    return text if len(text) <= MAX_MESSAGE_CHARS else text[: MAX_MESSAGE_CHARS - 3] + "..."


def _describe(error: BaseException) -> str:
    from pydantic import ValidationError
    from sqlalchemy.exc import DBAPIError

    name = type(error).__name__
    if isinstance(error, ValidationError):
        problems = "; ".join(
            f"{'.'.join(str(part) for part in item['loc']) or '<data>'}: {item['msg']}"
            for item in error.errors(include_url=False, include_context=False, include_input=False)
        )
        return f"{error.error_count()} validation error(s) for {error.title}: {problems}"
    if isinstance(error, DBAPIError):
        original = type(error.orig).__name__ if error.orig is not None else "unknown"
        code = sqlstate(error)
        text = f"database error {name} ({original}" + (f", sqlstate {code})" if code else ")")
        return text + (", connection invalidated" if error.connection_invalidated else "")
    if message_is_safe(error):
        lines = str(error).strip().splitlines()
        return lines[0] if lines else name
    if not str(error).strip():
        return f"{name} raised{_where(error)}"
    return f"{name} raised{_where(error)} (message withheld)"


def sqlstate(error: Any) -> str | None:
    """The SQLSTATE of a SQLAlchemy ``DBAPIError`` (asyncpg and psycopg spell it differently)."""
    original = error.orig
    code = getattr(original, "pgcode", None) or getattr(original, "sqlstate", None)
    return code if isinstance(code, str) else None


def _where(error: BaseException) -> str:
    frames = traceback.extract_tb(error.__traceback__) if error.__traceback__ else []
    if not frames:
        return ""
    last = frames[-1]
    return f" at {Path(last.filename).name}:{last.lineno}"
