"""``ConsumerApp``: handlers registered per (topic, CloudEvent type), and how they are called.

A handler's parameters are chosen by their annotations::

    @app.handler("order.placed", topic="orders")
    async def on_order_placed(order: OrderPlaced, session: AsyncSession) -> None: ...

- a pydantic model class: the event's ``data`` validated into it (failure: dead-lettered);
- ``CloudEvent``: the decoded event itself;
- ``KafkaRecord``: the record it arrived in (topic, partition, offset, key, timestamp,
  headers), which the CloudEvents binding keeps out of the event's attributes;
- ``AsyncSession``: the open session whose transaction also records the inbox claim;
- ``Session`` (sync handlers only): the same transaction, as a sync session.

``@app.batch_handler`` registers an async function that takes ``list[Model]``,
``list[CloudEvent]`` and/or ``list[KafkaRecord]`` plus the ``AsyncSession``, for effects
written many at a time.

Async handlers run on the event loop. A sync handler that takes a ``Session`` runs through
``AsyncSession.run_sync`` (on the loop, so keep it short); one that takes no session runs in a
worker thread.

A call that runs longer than its timeout (``handler_timeout_s``, or the handler's ``timeout_s``)
is cancelled and retried as a transient failure. Only an async handler really stops there: a
thread cannot be cancelled, so a sync handler's call goes on in its thread (its result is
ignored) while the record is retried, and one that takes a ``Session`` blocks the event loop,
so no timeout can fire until it returns.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import inspect
import re
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from cloudevents.core.base import BaseCloudEvent
from cloudevents.core.v1.event import CloudEvent
from outboxkit.consumers.decoding import DecodedEvent
from outboxkit.consumers.dlq import DEFAULT_DLQ_TOPIC
from outboxkit.consumers.inbox import DEFAULT_RETENTION_S
from outboxkit.consumers.metrics import HANDLER_SECONDS
from outboxkit.consumers.records import KafkaRecord
from outboxkit.consumers.sequence_policy import (
    DEFAULT_MAX_HELD,
    DEFAULT_MAX_HELD_PER_KEY,
    ON_DEAD_LETTER,
    ON_HOLD_FULL,
    OnDeadLetter,
    OnHoldFull,
)
from outboxkit.consumers.tables import CONSUMER_MAX
from outboxkit.outbox.backoff import Backoff
from outboxkit.outbox.retry import RetryPolicy
from pydantic import BaseModel
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

Unhandled = Literal["skip", "dead-letter"]
ANY_TYPE = "*"
"""Register a handler for this type to take every event of its topic no other handler takes."""
HandlerFunc = Callable[..., Any]

_TOPIC_NAME = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")


class HandlerSignatureError(TypeError):
    """A handler parameter has no annotation the runtime knows how to supply."""


@dataclass(frozen=True, slots=True)
class _Param:
    name: str
    kind: Literal["model", "event", "record", "session", "sync_session"]
    model: type[BaseModel] | None = None


@dataclass(frozen=True)
class Handler:
    """A registered handler: the function and how to build its arguments."""

    topic: str
    type: str
    func: HandlerFunc
    params: tuple[_Param, ...]
    is_async: bool
    batch: bool = False
    timeout_s: float | None = None
    """How long one call may run; ``None``: the app's ``handler_timeout_s``."""
    on_dead_letter: OnDeadLetter = "continue"
    """``"sequence"``: a dead-lettered record blocks its key (:mod:`.sequences`)."""

    @property
    def sequenced(self) -> bool:
        """Whether later records of a key wait behind one of its records dead-lettered."""
        return self.on_dead_letter == "sequence"

    @property
    def name(self) -> str:
        """``module.function``, for logs."""
        return f"{self.func.__module__}.{getattr(self.func, '__qualname__', self.func)}"

    def bind(self, event: CloudEvent, record: Any) -> dict[str, Any]:
        """Build the non-session arguments from ``event`` and the aiokafka ``record`` it came
        in; raises pydantic's ``ValidationError`` on bad data (and the decoder's
        ``InvalidJSONError`` on invalid JSON a model was to read)."""
        arguments: dict[str, Any] = {}
        for param in self.params:
            if param.kind == "event":
                arguments[param.name] = event
            elif param.kind == "record":
                arguments[param.name] = KafkaRecord.of(record)
            elif param.kind == "model":
                arguments[param.name] = _validate(param.model, event)
        return arguments

    async def call(self, session: AsyncSession, arguments: dict[str, Any]) -> None:
        """Run the handler with ``arguments`` and the session (or its sync face), timed.

        A batch handler gets a batch of one.
        """
        if self.batch:
            await self.call_batch(session, [arguments])
            return
        with HANDLER_SECONDS.labels(self.type).time():
            await self._call(session, arguments)

    async def call_batch(self, session: AsyncSession, batch: list[dict[str, Any]]) -> None:
        """Run a batch handler once for several events: each parameter gets the list of its
        per-event arguments, in offset order, and the session."""
        arguments: dict[str, Any] = {}
        for param in self.params:
            if param.kind == "session":
                arguments[param.name] = session
            else:
                arguments[param.name] = [each[param.name] for each in batch]
        with HANDLER_SECONDS.labels(self.type).time():
            await self.func(**arguments)

    async def _call(self, session: AsyncSession, arguments: dict[str, Any]) -> None:
        arguments = dict(arguments)
        if self.is_async:
            for param in self.params:
                if param.kind == "session":
                    arguments[param.name] = session
            await self.func(**arguments)
            return
        wants_session = [p.name for p in self.params if p.kind == "sync_session"]
        if wants_session:

            def run(sync_session: Session) -> None:
                for name in wants_session:
                    arguments[name] = sync_session
                self.func(**arguments)

            await session.run_sync(run)
        else:
            await asyncio.to_thread(functools.partial(self.func, **arguments))


def _validate(model: type[BaseModel] | None, event: CloudEvent) -> BaseModel:
    assert model is not None
    if isinstance(event, DecodedEvent):
        return event.validate_data(model)  # JSON data straight from the record's bytes
    data = event.get_data()
    if isinstance(data, bytes | str):
        return model.model_validate_json(data)
    return model.model_validate(data)


@dataclass
class ConsumerApp:
    """A consumer: its name (the inbox key and default group), handlers and failure policy.

    ``name``: identifies the consumer in the inbox, so each consumer applies an event once.
    ``group``: the Kafka consumer group (default: ``name``).
    ``dlq_topic``: dead-letter topic pattern; ``{topic}`` is the record's topic.
    ``unhandled``: what to do with an event no handler takes: ``"skip"`` or ``"dead-letter"``.
    ``retry``: backoff and bounds for failed attempts of a record (only its partition waits:
    the others go on, and the fetch loop keeps polling).
    ``dlq_retry``: the backoff while the dead-letter topic is unreachable (its bounds are
    ignored: nothing is committed until the letters are delivered); ``dlq_timeout_s``: how
    long one delivery may take before it counts as failed.
    ``inbox_retention_s``: how long claims are kept; ``retention_interval_s``: how often the
    runtime removes older ones (``None`` disables the periodic task).
    ``max_batch``: records fetched at once; one partition's records of a batch share a
    transaction.
    ``handler_timeout_s``: how long one handler call may run (a handler's own ``timeout_s``
    wins); a call that runs longer is cancelled and counts as a transient failure
    (:class:`~outboxkit.consumers.errors.HandlerTimeoutError`): retried, then dead-lettered.
    ``consumer_options`` / ``producer_options``: passed to aiokafka's consumer and to the
    dead-letter producer (security settings, timeouts).
    ``on_dead_letter``: ``"continue"`` (later records of a dead-lettered record's key are
    applied as they come) or ``"sequence"`` (they are held until it is replayed, skipped or
    released: :mod:`.sequences`); a handler's own ``on_dead_letter`` wins.
    ``max_held_per_key`` / ``max_held``: how many records may be held behind one key, and
    behind all keys of the consumer; past them ``on_hold_full`` says what happens:
    ``"stop"`` (the partition waits, order kept) or ``"dead-letter"`` (the record is
    dead-lettered, in order, and the key stays blocked).
    """

    name: str
    group: str | None = None
    dlq_topic: str = DEFAULT_DLQ_TOPIC
    unhandled: Unhandled = "skip"
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    dlq_retry: RetryPolicy = field(
        default_factory=lambda: RetryPolicy(
            max_attempts=2**31, backoff=Backoff(base_s=0.5, cap_s=30.0)
        )
    )
    dlq_timeout_s: float = 10.0
    inbox_retention_s: float = DEFAULT_RETENTION_S
    retention_interval_s: float | None = 3600.0
    max_batch: int = 500
    handler_timeout_s: float = 300.0
    consumer_options: dict[str, Any] = field(default_factory=dict)
    producer_options: dict[str, Any] = field(default_factory=dict)
    on_dead_letter: OnDeadLetter = "continue"
    max_held_per_key: int = DEFAULT_MAX_HELD_PER_KEY
    max_held: int = DEFAULT_MAX_HELD
    on_hold_full: OnHoldFull = "stop"
    handlers: dict[tuple[str, str], Handler] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        if not self.name or len(self.name) > CONSUMER_MAX:
            raise ValueError(f"consumer name must have 1 to {CONSUMER_MAX} characters")
        if self.unhandled not in ("skip", "dead-letter"):
            raise ValueError("unhandled must be 'skip' or 'dead-letter'")
        if self.max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        if self.dlq_timeout_s <= 0 or self.inbox_retention_s < 0:
            raise ValueError("dlq_timeout_s must be positive and inbox_retention_s not negative")
        if self.handler_timeout_s <= 0:
            raise ValueError("handler_timeout_s must be positive")
        if self.retention_interval_s is not None and self.retention_interval_s <= 0:
            raise ValueError("retention_interval_s must be positive (or None)")
        if "{topic}" not in self.dlq_topic and not _TOPIC_NAME.match(self.dlq_topic):
            raise ValueError(f"invalid dead-letter topic {self.dlq_topic!r}")
        if self.on_dead_letter not in ON_DEAD_LETTER:
            raise ValueError("on_dead_letter must be 'continue' or 'sequence'")
        if self.on_hold_full not in ON_HOLD_FULL:
            raise ValueError("on_hold_full must be 'stop' or 'dead-letter'")
        if self.max_held_per_key < 1 or self.max_held < 1:
            raise ValueError("max_held_per_key and max_held must be at least 1")

    @property
    def sequenced(self) -> bool:
        """Whether any handler keeps its keys' order across dead letters."""
        return self.on_dead_letter == "sequence" or any(
            handler.sequenced for handler in self.handlers.values()
        )

    @property
    def group_id(self) -> str:
        """The Kafka consumer group."""
        return self.group or self.name

    @property
    def topics(self) -> list[str]:
        """The topics the handlers subscribe to."""
        return sorted({topic for topic, _ in self.handlers})

    def handler(
        self,
        type: str,
        *,
        topic: str,
        timeout_s: float | None = None,
        on_dead_letter: OnDeadLetter | None = None,
    ) -> Callable[[HandlerFunc], HandlerFunc]:
        """Register the decorated function for events of ``type`` on ``topic``.

        ``timeout_s`` bounds one call of it (default: the app's ``handler_timeout_s``);
        ``on_dead_letter`` overrides the app's (``"sequence"``: keep the key's order).
        """
        return self._register(
            type, topic, batch=False, timeout_s=timeout_s, on_dead_letter=on_dead_letter
        )

    def batch_handler(
        self,
        type: str,
        *,
        topic: str,
        timeout_s: float | None = None,
        on_dead_letter: OnDeadLetter | None = None,
    ) -> Callable[[HandlerFunc], HandlerFunc]:
        """Register the decorated async function for *batches* of events of ``type``.

        It takes ``list[Model]``, ``list[CloudEvent]`` and/or ``list[KafkaRecord]`` (the same
        events, in offset order) and the ``AsyncSession``; it is called once for consecutive
        new events of one partition in one transaction, so it can write all their effects in
        one statement. If it raises, none of the batch took effect and each event of it is
        handled again on its own (a batch of one), so retries and dead letters stay per event.
        ``timeout_s`` bounds one call (default: the app's ``handler_timeout_s``);
        ``on_dead_letter`` overrides the app's.
        """
        return self._register(
            type, topic, batch=True, timeout_s=timeout_s, on_dead_letter=on_dead_letter
        )

    def _register(
        self,
        type: str,
        topic: str,
        *,
        batch: bool,
        timeout_s: float | None,
        on_dead_letter: OnDeadLetter | None,
    ) -> Callable[[HandlerFunc], HandlerFunc]:
        if not type:
            raise ValueError("event type must be a non-empty string")
        if timeout_s is not None and timeout_s <= 0:
            raise ValueError("timeout_s must be positive (or None for the app's default)")
        if not _TOPIC_NAME.match(topic):
            raise ValueError(f"invalid Kafka topic name {topic!r}")
        if on_dead_letter is not None and on_dead_letter not in ON_DEAD_LETTER:
            raise ValueError("on_dead_letter must be 'continue' or 'sequence'")
        policy = on_dead_letter or self.on_dead_letter

        def register(func: HandlerFunc) -> HandlerFunc:
            if (topic, type) in self.handlers:
                raise ValueError(f"a handler for {type!r} on {topic!r} is already registered")
            handler = _describe(topic, type, func, batch)
            self.handlers[(topic, type)] = dataclasses.replace(
                handler, timeout_s=timeout_s, on_dead_letter=policy
            )
            return func

        return register

    def handler_for(self, topic: str, type: str) -> Handler | None:
        """The handler of ``type`` on ``topic``, else the topic's handler of any type (``"*"``)."""
        return self.handlers.get((topic, type)) or self.handlers.get((topic, ANY_TYPE))

    def timeout_for(self, handler: Handler) -> float:
        """How long one call of ``handler`` may run, in seconds."""
        return self.handler_timeout_s if handler.timeout_s is None else handler.timeout_s


def _describe(topic: str, type: str, func: HandlerFunc, batch: bool) -> Handler:
    is_async = inspect.iscoroutinefunction(func)
    if batch and not is_async:
        raise HandlerSignatureError(f"{func.__qualname__}: a batch handler must be async")
    try:
        hints = typing.get_type_hints(func)
    except Exception as error:
        raise HandlerSignatureError(f"cannot resolve annotations of {func!r}: {error}") from None
    params: list[_Param] = []
    for parameter in inspect.signature(func).parameters.values():
        annotation = hints.get(parameter.name)
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            raise HandlerSignatureError(f"{func.__qualname__}: *args/**kwargs are not supported")
        if batch and annotation is not None and typing.get_origin(annotation) is list:
            (annotation,) = typing.get_args(annotation)  # list[Model], list[CloudEvent], ...
        elif batch and not (inspect.isclass(annotation) and issubclass(annotation, AsyncSession)):
            raise HandlerSignatureError(
                f"{func.__qualname__}({parameter.name}): a batch handler takes list[Model], "
                "list[CloudEvent], list[KafkaRecord] and AsyncSession"
            )
        params.append(_param_for(func, parameter.name, annotation, is_async))
    return Handler(
        topic=topic, type=type, func=func, params=tuple(params), is_async=is_async, batch=batch
    )


def _param_for(func: HandlerFunc, name: str, annotation: Any, is_async: bool) -> _Param:
    where = f"{getattr(func, '__qualname__', func)}({name})"
    if annotation in (CloudEvent, BaseCloudEvent):
        return _Param(name, "event")
    if annotation is KafkaRecord:
        return _Param(name, "record")
    if inspect.isclass(annotation):
        if issubclass(annotation, BaseModel):
            return _Param(name, "model", annotation)
        if issubclass(annotation, AsyncSession):
            if not is_async:
                raise HandlerSignatureError(
                    f"{where}: a sync handler takes Session, not AsyncSession"
                )
            return _Param(name, "session")
        if issubclass(annotation, Session):
            if is_async:
                raise HandlerSignatureError(f"{where}: an async handler takes AsyncSession")
            return _Param(name, "sync_session")
    raise HandlerSignatureError(
        f"{where}: annotate it with a pydantic model, CloudEvent, KafkaRecord, AsyncSession "
        "or Session"
    )
