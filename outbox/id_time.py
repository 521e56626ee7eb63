"""The time an event id carries: the millisecond timestamp of a UUIDv7 (RFC 9562), else none.

outboxkit's own event ids are UUIDv7 (:func:`outboxkit.outbox.events.new_event_id`). The inbox
partitions its claims by this time (:mod:`outboxkit.consumers.inbox_partitions`): a pure
function of the id, so every delivery of an event looks its claim up in the same partition.
"""

from __future__ import annotations

import re

UNTIMED = 0
"""The time of an id that carries none (not a UUIDv7): the inbox's untimed partition."""

_HEX = "[0-9a-fA-F]"
_UUID7 = re.compile(f"{_HEX}{{8}}-{_HEX}{{4}}-7{_HEX}{{3}}-[89abAB]{_HEX}{{3}}-{_HEX}{{12}}")


def id_time_ms(event_id: str) -> int:
    """The epoch milliseconds in ``event_id`` if it is a UUIDv7 in its canonical text form
    (any case), else :data:`UNTIMED`. A UUIDv7 whose time is 0 also counts as untimed."""
    if len(event_id) != 36 or _UUID7.fullmatch(event_id) is None:
        return UNTIMED
    return int(event_id[:8] + event_id[9:13], 16)
