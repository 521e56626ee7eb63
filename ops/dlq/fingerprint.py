"""Error fingerprints: one failure cause, whatever values its messages mention.

``order 17 exceeds limit 500`` and ``order 42 exceeds limit 500`` are one cause: the values
(uuids, times, quoted strings, hex, numbers) are replaced by placeholders, and the error class
is kept, so ``dlq list --group`` counts failures per cause.
"""

from __future__ import annotations

import hashlib
import re

_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    (
        re.compile(
            r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b"
        ),
        "<uuid>",
    ),
    (
        re.compile(
            r"\b\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?)?"
        ),
        "<time>",
    ),
    (re.compile(r"(?<!\w)'(?:[^'\\]|\\.)*'"), "<str>"),  # not the one in "can't"
    (re.compile(r'"(?:[^"\\]|\\.)*"'), "<str>"),
    (re.compile(r"\b0[xX][0-9a-fA-F]+\b"), "<hex>"),
    # Long runs of hex digits with at least one digit and one letter: hashes, tokens, ids.
    (re.compile(r"\b(?=[0-9a-fA-F]*\d)(?=[0-9a-fA-F]*[a-fA-F])[0-9a-fA-F]{8,}\b"), "<hex>"),
    # A SQLSTATE names the kind of database error: it is part of the cause, not a value.
    (
        re.compile(r"(?<![\w.])(?<!sqlstate )[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?(?![\w])"),
        "<num>",
    ),
)
_SPACES = re.compile(r"\s+")


def normalise(message: str | None) -> str:
    """``message`` with values as ``<uuid>``, ``<time>``, ``<str>``, ``<hex>``, ``<num>``."""
    text = message or ""
    for pattern, placeholder in _PATTERNS:
        text = pattern.sub(placeholder, text)
    return _SPACES.sub(" ", text).strip()


def fingerprint(error_class: str | None, message: str | None) -> str:
    """The cause of a failure: its error class and its normalised message."""
    return f"{error_class or '-'} | {normalise(message)}"


def fingerprint_id(error_class: str | None, message: str | None) -> str:
    """A short stable id of the fingerprint (12 hex digits), for scripts and alerts."""
    digest = hashlib.sha256(fingerprint(error_class, message).encode("utf-8")).hexdigest()
    return digest[:12]
