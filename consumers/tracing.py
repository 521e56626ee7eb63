"""Per handler call telemetry of the consumer: an ``outbox consume`` span, and commit times.

Each handler attempt runs under a span (kind CONSUMER) that is *current* while the handler
runs, so an event the handler writes with ``Outbox.add`` takes it as its originating trace and
chains of consumers continue the trace. Its parent is the relay's hop (the Kafka ``traceparent``
header) and it links to the originating context (``ce_traceparent``/``ce_tracestate``, or the
event's ``traceparent`` extension in structured mode); without a hop the origin is the parent,
without either the span starts a new trace.

A span ends at the handler's end time, once the outcome of its attempt is known: the
transaction committed (status unset), was rolled back because of another record or a failed
commit (event ``consume.rolled_back``), or the attempt failed and the runtime decided to retry
(event ``consume.retry``) or to dead-letter (event ``consume.dead_lettered``); both failures
set error status with the error's class only. A record dead-lettered without any handler
attempt (undecodable, no handler, failed commits) gets a span of its own for the decision.
Redeliveries skipped by the inbox get no span: the handler does not run. Without a configured
OpenTelemetry SDK (:func:`outboxkit.outbox.telemetry.enabled`) no span work is done at all.

The same per-transaction object collects the CloudEvents ``time`` of every applied event and
observes ``outboxkit_consumer_commit_to_effect_seconds`` once the transaction committed.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Iterator, Mapping
from types import TracebackType
from typing import Any

from aiokafka import ConsumerRecord, TopicPartition
from cloudevents.core.v1.event import CloudEvent
from outboxkit.consumers.metrics import COMMIT_TO_EFFECT
from outboxkit.outbox import telemetry

try:  # only used once telemetry.enabled() said OpenTelemetry is there
    from opentelemetry import context as _otel_context
    from opentelemetry import trace as _trace
except ImportError:  # pragma: no cover - exercised where opentelemetry is absent
    _otel_context = _trace = None  # type: ignore[assignment]

SPAN_NAME = "outbox consume"
# Headers read for a span: trace context, and the binary-mode attributes of an undecodable record.
_SPAN_HEADERS = frozenset(
    {telemetry.HOP_HEADER, "tracestate", *telemetry.ORIGIN_HEADERS, "ce_type", "ce_source", "ce_id"}
)

_Key = tuple[str, int, int]  # topic, partition, offset


def _key(record: ConsumerRecord) -> _Key:
    return record.topic, record.partition, record.offset


def event_time_s(event: CloudEvent) -> float | None:
    """When the event happened: its ``time`` attribute.

    The CloudEvents SDK gives an event without ``time`` the moment it was built (here: when the
    consumer decoded it), so such events count as applied almost at once.
    """
    happened = event.get_time()
    return happened.timestamp() if happened is not None else None


class HandlerTelemetry:
    """The consume spans of one runtime and the failed attempts awaiting the runtime's decision.

    ``group`` is the Kafka consumer group, ``consumer`` the consumer name (metric label).
    """

    def __init__(self, group: str, consumer: str) -> None:
        self.group = group
        self._effect_seconds = COMMIT_TO_EFFECT.labels(consumer)
        self._failed: dict[_Key, tuple[Any, int]] = {}

    def transaction(self) -> Transaction:
        """A collector for the handler calls of one database transaction."""
        return Transaction(self, telemetry.enabled())

    def retrying(self, record: ConsumerRecord, attempt: int, error: BaseException) -> None:
        """The failed ``attempt`` of ``record`` will be tried again."""
        pending = self._failed.pop(_key(record), None)
        if pending is not None:
            name = type(error).__name__
            _finish(pending, "consume.retry", {"attempt": attempt, "error.type": name}, name)

    def dead_lettered(
        self, record: ConsumerRecord, attempts: int, error: BaseException, error_class: str
    ) -> None:
        """``record`` goes to the dead-letter topic after ``attempts`` attempts."""
        pending = self._failed.pop(_key(record), None)
        if pending is None:
            if not telemetry.enabled():
                return
            pending = (self.start(record, None, attempts), time.time_ns())
        name = type(error).__name__
        attributes = {"attempt": attempts, "error.type": name, "outboxkit.error_class": error_class}
        _finish(pending, "consume.dead_lettered", attributes, name)

    def forget(self, partitions: Iterable[TopicPartition] | None = None) -> None:
        """End the failed attempts of ``partitions`` (all if ``None``) left undecided.

        Their records are abandoned (revoked, stopping) and will be redelivered.
        """
        wanted = None if partitions is None else {(tp.topic, tp.partition) for tp in partitions}
        for key in [k for k in self._failed if wanted is None or k[:2] in wanted]:
            _finish(self._failed.pop(key), "consume.abandoned", None, None)

    def start(self, record: ConsumerRecord, event: CloudEvent | None, attempt: int) -> Any:
        """Start (not make current) the span of one attempt to handle ``record``."""
        headers = _span_headers(record.headers)
        hop = (
            {k: headers[k] for k in (telemetry.HOP_HEADER, "tracestate") if k in headers}
            if telemetry.HOP_HEADER in headers
            else {}
        )
        origin = telemetry.origin_carrier(headers)
        if not origin and event is not None:
            origin = _origin_from_extensions(event)
        attributes: dict[str, Any] = {
            "messaging.system": "kafka",
            "messaging.operation.type": "process",
            "messaging.destination.name": record.topic,
            "messaging.destination.partition.id": str(record.partition),
            "messaging.kafka.offset": record.offset,
            "messaging.consumer.group.name": self.group,
            "outboxkit.attempt": attempt,
        }
        if event is not None:
            attributes["cloudevents.event_type"] = event.get_type()
            attributes["cloudevents.event_source"] = event.get_source()
            attributes["cloudevents.event_id"] = event.get_id()
            subject = event.get_subject()
            if subject is not None:
                # The standard attribute; agent-action events carry their operation key here.
                attributes["cloudevents.event_subject"] = subject
        else:  # binary-mode attribute headers, when the record could not be decoded
            attributes["cloudevents.event_type"] = headers.get("ce_type")
            attributes["cloudevents.event_source"] = headers.get("ce_source")
            attributes["cloudevents.event_id"] = headers.get("ce_id")
        parent = hop or origin
        links: list[Mapping[str, str]] | None = [origin] if hop and origin else None
        if parent:
            return telemetry.start_span(
                SPAN_NAME, kind="consumer", parent=parent, links=links, attributes=attributes
            )
        # No trace travelled with the record: a new trace, whatever is current in the runtime.
        token = _otel_context.attach(_otel_context.Context())
        try:
            return telemetry.start_span(SPAN_NAME, kind="consumer", attributes=attributes)
        finally:
            _otel_context.detach(token)

    def _failed_attempt(self, record: ConsumerRecord, span: Any, end_ns: int) -> None:
        stale = self._failed.pop(_key(record), None)
        if stale is not None:
            _finish(stale, "consume.abandoned", None, None)
        self._failed[_key(record)] = (span, end_ns)


class Transaction:
    """The handler calls of one database transaction, settled with :meth:`committed` or
    :meth:`rolled_back`.

    ``with transaction.call(record, event, attempt):`` wraps one handler call: the span is
    current inside; a call that raises leaves its span to the runtime's decision.
    """

    __slots__ = ("_attempt", "_event", "_owner", "_record", "_span", "_spans", "_times", "_token")

    def __init__(self, owner: HandlerTelemetry, tracing: bool) -> None:
        self._owner = owner
        self._spans: list[tuple[Any, int]] | None = [] if tracing else None
        self._times: list[float] = []
        self._span: Any = None
        self._token: Any = None

    def call(self, record: ConsumerRecord, event: CloudEvent, attempt: int) -> Transaction:
        """Prepare to wrap the handler call of ``attempt`` for ``record``."""
        self._record, self._event, self._attempt = record, event, attempt
        return self

    def __enter__(self) -> Transaction:
        if self._spans is not None:
            self._span = self._owner.start(self._record, self._event, self._attempt)
            if self._span is not None:
                self._token = _otel_context.attach(_trace.set_span_in_context(self._span))
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        span, self._span = self._span, None
        if span is not None:
            _otel_context.detach(self._token)
            self._token = None
            if error is not None:
                self._owner._failed_attempt(self._record, span, time.time_ns())
            else:
                self._spans.append((span, time.time_ns()))  # type: ignore[union-attr]
        if error is None:
            self._applied(self._event)

    @contextlib.contextmanager
    def call_batch(self, items: list[tuple[ConsumerRecord, CloudEvent]]) -> Iterator[None]:
        """Wrap one batch-handler call for several records (first attempt of each).

        Each record gets its span, none current (there is no single parent). If the call
        raises, the spans end with ``consume.rolled_back``: every record of the batch is
        handled again on its own, under spans of its own.
        """
        spans = (
            [self._owner.start(record, event, 1) for record, event in items]
            if self._spans is not None
            else []
        )
        try:
            yield
        except BaseException:
            ended = time.time_ns()
            for span in spans:
                _finish((span, ended), "consume.rolled_back", None, None)
            raise
        ended = time.time_ns()
        if self._spans is not None:
            self._spans.extend((span, ended) for span in spans)
        for _, event in items:
            self._applied(event)

    def _applied(self, event: CloudEvent) -> None:
        """Note when an event whose handler returned happened, for the commit-to-effect time."""
        happened = event_time_s(event)
        if happened is not None:
            self._times.append(happened)

    def committed(self) -> None:
        """The transaction committed: end the spans, observe event-time-to-commit per event."""
        now = time.time()
        observe = self._owner._effect_seconds.observe
        for happened in self._times:
            observe(max(0.0, now - happened))
        for pending in self._spans or ():
            _finish(pending, None, None, None)

    def rolled_back(self) -> None:
        """The transaction was rolled back: the calls that returned took no effect."""
        for pending in self._spans or ():
            _finish(pending, "consume.rolled_back", None, None)
        self._spans = [] if self._spans is not None else None
        self._times = []


def _finish(
    pending: tuple[Any, int],
    event: str | None,
    attributes: dict[str, Any] | None,
    error_class: str | None,
) -> None:
    span, end_ns = pending
    if span is None:
        return
    if event is not None:
        span.add_event(event, attributes or {}, timestamp=end_ns)
    if error_class:
        telemetry.mark_error(span, error_class)
    span.end(end_time=end_ns)


def _span_headers(headers: Iterable[tuple[str, bytes | None]] | None) -> dict[str, str]:
    """The trace and CloudEvents attribute headers of a record, as text."""
    found: dict[str, str] = {}
    for name, value in headers or ():
        if value is not None and name in _SPAN_HEADERS:
            found[name] = value.decode("utf-8", errors="replace")
    return found


def _origin_from_extensions(event: CloudEvent) -> dict[str, str]:
    """A structured-mode event's distributed-tracing extension (no ``ce_`` headers then)."""
    carrier = {}
    for name in ("traceparent", "tracestate"):
        value = event.get_extension(name)
        if isinstance(value, str) and value:
            carrier[name] = value
    return carrier
