"""One LISTEN connection per process for every listener of a (server URL, channel).

Each caller waiting for a change (an agent operation running elsewhere, the relay's commit
wake-up, a workflow worker) used to open a LISTEN connection of its own, outside the pool: 40
waiters of one key made 40 server connections. Here the first subscriber of a (URL, channel) in
an event loop opens the connection, the others join it, and the last to leave closes it.

A listener is an optimisation (every subscriber polls as well), so an outage never fails a
subscriber: a lost connection wakes every subscriber (they poll at once) and is reopened with
backoff while any subscriber remains; one WARNING when it is lost or cannot be opened, one INFO
``LISTEN restored`` when it is back, which wakes every subscriber again (to catch up on what was
committed meanwhile).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from outboxkit.outbox.backoff import Backoff
from outboxkit.outbox.notify import LISTEN_ERRORS, listening
from sqlalchemy.engine import URL, make_url

log = logging.getLogger("outboxkit.listen")
RECONNECT_BACKOFF = Backoff(base_s=0.5, cap_s=15.0, floor_s=0.1)


@dataclass(eq=False)
class Subscriber:
    """What a subscriber is told: every notification's payload, and when to poll at once."""

    on_notify: Callable[[str], None]
    on_wake: Callable[[], None]


@dataclass(eq=False)
class _Shared:
    """The connection of one (URL, channel) in one event loop, and who listens through it."""

    url: URL
    channel: str
    subscribers: set[Subscriber] = field(default_factory=set)
    first_try: asyncio.Event = field(default_factory=asyncio.Event)
    up: bool = False
    task: asyncio.Task[None] | None = None

    def deliver(self, payload: str) -> None:
        for subscriber in list(self.subscribers):
            subscriber.on_notify(payload)

    def wake_all(self) -> None:
        for subscriber in list(self.subscribers):
            subscriber.on_wake()

    async def keep_listening(self) -> None:
        """Hold the connection open, reopening it with backoff; logs once per outage."""
        where = f"channel {self.channel} on {self.url.render_as_string(hide_password=True)}"
        failures = 0
        outage = False
        while True:
            try:
                async with listening(self.url, self.channel, self.deliver) as lost:
                    self.up = True
                    if outage:
                        log.info("LISTEN restored (%s)", where)
                        self.wake_all()  # catch up on what was committed meanwhile
                    failures, outage = 0, False
                    self.first_try.set()
                    await lost.wait()
                    self.up = False
                    outage = True
                    log.warning("LISTEN connection lost (%s), polling meanwhile", where)
                    self.wake_all()
            except Exception as error:  # whatever it is, the listeners poll meanwhile
                # LISTEN_ERRORS are the expected outages; anything else is said with its type
                # (it would otherwise end this task, and LISTEN with it, without a word).
                self.up = False
                failures += 1
                if not outage:
                    outage = True
                    reason = error if isinstance(error, LISTEN_ERRORS) else type(error).__name__
                    log.warning("LISTEN unavailable (%s), polling meanwhile: %s", where, reason)
                self.first_try.set()
                await asyncio.sleep(RECONNECT_BACKOFF.delay(failures))


_SHARED: dict[tuple[asyncio.AbstractEventLoop, str, str], _Shared] = {}


@contextlib.asynccontextmanager
async def shared_listening(
    db_url: str | URL,
    channel: str,
    on_notify: Callable[[str], None],
    on_wake: Callable[[], None],
) -> AsyncIterator[Subscriber]:
    """Receive ``channel``'s notifications through this process's one connection for it.

    ``on_notify(payload)`` is called for each; ``on_wake()`` when the connection is lost or
    restored (poll then). On entry the connection has been tried once, so when it is up, every
    change committed after entry is notified. Never raises for an outage: the subscriber polls.
    """
    url = make_url(db_url) if isinstance(db_url, str) else db_url
    loop = asyncio.get_running_loop()
    key = (loop, url.render_as_string(hide_password=False), channel)
    shared = _SHARED.get(key)
    if shared is None:
        shared = _SHARED[key] = _Shared(url, channel)
        shared.task = loop.create_task(shared.keep_listening(), name=f"outboxkit-listen-{channel}")
    subscriber = Subscriber(on_notify, on_wake)
    shared.subscribers.add(subscriber)
    try:
        await shared.first_try.wait()
        yield subscriber
    finally:
        shared.subscribers.discard(subscriber)
        if not shared.subscribers and _SHARED.get(key) is shared:
            del _SHARED[key]  # a newcomer from now on opens a new connection
            if shared.task is not None:
                shared.task.cancel()
                await asyncio.gather(shared.task, return_exceptions=True)


def subscriber_count() -> int:
    """How many subscribers listen through this process's shared connections now."""
    return sum(len(shared.subscribers) for shared in _SHARED.values())


def open_connections() -> int:
    """How many shared LISTEN connections this process holds open now (for tests and metrics)."""
    return sum(1 for shared in _SHARED.values() if shared.up)
