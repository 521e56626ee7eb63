"""The dead-letter record format: the header names, and :class:`DeadLetter`, which writes them
(the consumer runtime) and reads them back (the operator tools).

A dead-letter record keeps the original key, value and headers; these are added beside them.
Values are UTF-8 strings; times are epoch milliseconds. No payload and no secret goes here.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from outboxkit.outbox.secrecy import MAX_MESSAGE_CHARS

ERROR_CLASS = "outboxkit-error-class"
"""Category and exception, e.g. ``permanent:ValidationError`` or ``exhausted:TimeoutError``."""
ERROR_MESSAGE = "outboxkit-error-message"
"""A short message (at most 300 characters), never the payload."""
ORIGINAL_TOPIC = "outboxkit-original-topic"
ORIGINAL_PARTITION = "outboxkit-original-partition"
ORIGINAL_OFFSET = "outboxkit-original-offset"
ORIGINAL_TIMESTAMP = "outboxkit-original-timestamp"
CONSUMER_GROUP = "outboxkit-consumer-group"
ATTEMPTS = "outboxkit-attempts"
FIRST_FAILURE_MS = "outboxkit-first-failure-ms"
LAST_FAILURE_MS = "outboxkit-last-failure-ms"
TRUNCATED = "outboxkit-truncated"
"""Set when the broker refused the letter as it was (its size, an invalid record): what was left
out to make it fit, ``value``, ``value,headers`` or ``value,headers,key``."""
ORIGINAL_SIZE = "outboxkit-original-size"
"""With ``outboxkit-truncated``: the size in bytes of the original value."""

ALL = (
    ERROR_CLASS,
    ERROR_MESSAGE,
    ORIGINAL_TOPIC,
    ORIGINAL_PARTITION,
    ORIGINAL_OFFSET,
    ORIGINAL_TIMESTAMP,
    CONSUMER_GROUP,
    ATTEMPTS,
    FIRST_FAILURE_MS,
    LAST_FAILURE_MS,
)
"""The facts every dead letter carries."""
TRUNCATION = (TRUNCATED, ORIGINAL_SIZE)
"""The facts of a dead letter cut down to be accepted (only on those)."""

_OURS = frozenset(ALL + TRUNCATION)
Header = tuple[str, bytes | None]


class ConsumedRecord(Protocol):
    """What :meth:`DeadLetter.from_record` reads of a consumed record (aiokafka's has it)."""

    @property
    def key(self) -> bytes | None: ...
    @property
    def value(self) -> bytes | None: ...
    @property
    def headers(self) -> Sequence[Header] | None: ...


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """One dead letter: the original record and the failure facts its headers carry.

    The runtime builds one from the failed record; :meth:`from_record` reads one back from the
    dead-letter topic, where a fact that is missing or unreadable is ``None`` (a record written
    by another tool, or by hand). ``headers`` are the record's headers as they are: earlier
    ``outboxkit-*`` ones included, which :meth:`to_headers` replaces with fresh facts.
    """

    topic: str | None
    partition: int | None
    offset: int | None
    timestamp: int | None
    key: bytes | None
    value: bytes | None
    headers: Sequence[Header]
    error_class: str | None
    error_message: str | None
    attempts: int | None
    first_failure_ms: int | None
    last_failure_ms: int | None
    consumer_group: str | None = None
    """The group that dead-lettered it, as read back (the writer passes it to to_headers)."""
    truncated: str | None = None
    """What was left out because the broker refused the whole letter (``TRUNCATED``)."""
    original_size: int | None = None
    """The size of the original value in bytes, when ``truncated`` is set."""

    def original_headers(self) -> list[Header]:
        """The headers without the dead-letter ones: those of the original record."""
        return [(name, value) for name, value in self.headers if name not in _OURS]

    def to_headers(self, group: str) -> list[Header]:
        """The original headers (minus earlier outboxkit ones) followed by the failure headers.

        A fact that is ``None`` has no header. ``group`` is the consumer group dead-lettering it.
        """
        facts = {
            ERROR_CLASS: self.error_class,
            ERROR_MESSAGE: None
            if self.error_message is None
            else self.error_message[:MAX_MESSAGE_CHARS],
            ORIGINAL_TOPIC: self.topic,
            ORIGINAL_PARTITION: _text(self.partition),
            ORIGINAL_OFFSET: _text(self.offset),
            ORIGINAL_TIMESTAMP: _text(self.timestamp),
            CONSUMER_GROUP: group,
            ATTEMPTS: _text(self.attempts),
            FIRST_FAILURE_MS: _text(self.first_failure_ms),
            LAST_FAILURE_MS: _text(self.last_failure_ms),
            TRUNCATED: self.truncated,
            ORIGINAL_SIZE: _text(self.original_size),
        }
        # A record replayed from a dead-letter topic that fails again gets fresh facts, not two.
        return self.original_headers() + [
            (name, value.encode("utf-8")) for name, value in facts.items() if value is not None
        ]

    @classmethod
    def from_record(cls, record: ConsumedRecord) -> DeadLetter:
        """Read a record of a dead-letter topic back; missing or unreadable facts are ``None``."""
        headers = tuple(record.headers or ())
        texts = header_texts(headers)
        return cls(
            topic=texts.get(ORIGINAL_TOPIC) or None,
            partition=_int(texts.get(ORIGINAL_PARTITION)),
            offset=_int(texts.get(ORIGINAL_OFFSET)),
            timestamp=_int(texts.get(ORIGINAL_TIMESTAMP)),
            key=record.key,
            value=record.value,
            headers=headers,
            error_class=texts.get(ERROR_CLASS),
            error_message=texts.get(ERROR_MESSAGE),
            attempts=_int(texts.get(ATTEMPTS)),
            first_failure_ms=_int(texts.get(FIRST_FAILURE_MS)),
            last_failure_ms=_int(texts.get(LAST_FAILURE_MS)),
            consumer_group=texts.get(CONSUMER_GROUP),
            truncated=texts.get(TRUNCATED) or None,
            original_size=_int(texts.get(ORIGINAL_SIZE)),
        )


def header_texts(headers: Iterable[Header]) -> dict[str, str]:
    """Headers as ``{lower-case name: text}``; the last of a repeated name wins."""
    texts: dict[str, str] = {}
    for name, value in headers:
        # The last one wins, as the dead-letter facts are appended after the original headers.
        texts[name.lower()] = (value or b"").decode("utf-8", "replace")
    return texts


def _cut(message: str | None) -> str | None:
    return None if message is None else message[:MAX_MESSAGE_CHARS]


def _text(number: int | None) -> str | None:
    return None if number is None else str(number)


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None
