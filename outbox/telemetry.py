"""Tracing hooks: OpenTelemetry when it is installed, nothing at all when it is not.

The trace context current when an event is written travels as the CloudEvents distributed
tracing extension (``ce_traceparent``/``ce_tracestate``: the *originating* trace). Each hop
(relay publish, consumer handling) puts its own context in the Kafka ``traceparent`` header.
Spans never carry payloads: only types, ids, topics, partitions, offsets and counts.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

try:  # the optional extra "otel"
    from opentelemetry import context as otel_context
    from opentelemetry import propagate, trace
    from opentelemetry.trace import Link, SpanKind, Status, StatusCode

    OTEL_INSTALLED = True
except ImportError:  # pragma: no cover - exercised where opentelemetry is absent
    OTEL_INSTALLED = False

TRACER_NAME = "outboxkit"
ORIGIN_HEADERS = ("ce_traceparent", "ce_tracestate")
HOP_HEADER = "traceparent"


def enabled() -> bool:
    """True when OpenTelemetry is installed and a tracer provider has been configured.

    With the API alone (the default proxy provider) spans would be no-ops, so per-record span
    work is skipped entirely.
    """
    return OTEL_INSTALLED and not isinstance(
        trace.get_tracer_provider(), trace.ProxyTracerProvider | trace.NoOpTracerProvider
    )


def current_context_headers() -> dict[str, str]:
    """``traceparent``/``tracestate`` of the span current now, or ``{}`` when there is none."""
    if not OTEL_INSTALLED or not trace.get_current_span().get_span_context().is_valid:
        return {}
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return {k: v for k, v in carrier.items() if k in ("traceparent", "tracestate")}


_KINDS = {"producer": SpanKind.PRODUCER, "consumer": SpanKind.CONSUMER} if OTEL_INSTALLED else {}


def _extract(carrier: Mapping[str, str]) -> Any:
    return propagate.extract(dict(carrier))


def origin_carrier(headers: Mapping[str, str]) -> dict[str, str]:
    """The originating trace context of an event, from its ``ce_traceparent``/``ce_tracestate``."""
    return {name[3:]: headers[name] for name in ORIGIN_HEADERS if name in headers}


def start_span(
    name: str,
    *,
    kind: str = "internal",
    parent: Mapping[str, str] | None = None,
    links: list[Mapping[str, str]] | None = None,
    attributes: Mapping[str, Any] | None = None,
) -> Any:
    """Start a span under ``parent`` (a W3C carrier) linked to ``links``; ``None`` without OTel.

    The span is not made current: end it with :func:`end_span`, possibly after awaits.
    """
    if not OTEL_INSTALLED:
        return None
    span_links = []
    for carrier in links or []:
        linked = trace.get_current_span(_extract(carrier)).get_span_context()
        if linked.is_valid:
            span_links.append(Link(linked))
    return trace.get_tracer(TRACER_NAME).start_span(
        name,
        context=_extract(parent) if parent else None,
        kind=_KINDS.get(kind, SpanKind.INTERNAL),
        links=span_links,
        attributes={k: v for k, v in (attributes or {}).items() if v is not None},
    )


def end_span(
    current: Any, error_class: str | None = None, attributes: Mapping[str, Any] | None = None
) -> None:
    """Set final attributes, mark an error by its class only, and end the span."""
    if current is None:
        return
    if attributes:
        current.set_attributes({k: v for k, v in attributes.items() if v is not None})
    if error_class:
        mark_error(current, error_class)
    current.end()


@contextmanager
def span(name: str, **options: Any) -> Iterator[Any]:
    """:func:`start_span` as a context manager whose span is current inside the block."""
    current = start_span(name, **options)
    if current is None:
        yield None
        return
    with trace.use_span(current, end_on_exit=True, record_exception=False):
        yield current


def mark_error(current: Any, error_class: str) -> None:
    """Flag ``current`` as failed with the error's class only (no message: it may quote data)."""
    if current is not None:
        current.set_status(Status(StatusCode.ERROR, error_class))


def add_event(current: Any, name: str, attributes: Mapping[str, Any] | None = None) -> None:
    """Record a span event (a retry, a dead-lettering) on ``current``."""
    if current is not None:
        current.add_event(name, dict(attributes or {}))


def hop_header(current: Any) -> tuple[str, bytes] | None:
    """The Kafka ``traceparent`` header for the hop that ``current`` represents."""
    if current is None or not current.get_span_context().is_valid:
        return None
    carrier: dict[str, str] = {}
    propagate.inject(carrier, context=trace.set_span_in_context(current, otel_context.Context()))
    value = carrier.get(HOP_HEADER)
    return (HOP_HEADER, value.encode()) if value else None
