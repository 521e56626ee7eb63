"""The time in an event id: what the inbox partitions its claims by."""

from __future__ import annotations

import time
import uuid

from outboxkit.outbox.events import new_event_id
from outboxkit.outbox.id_time import UNTIMED, id_time_ms


def test_a_new_event_id_carries_the_time_it_was_made() -> None:
    before = int(time.time() * 1000)
    event_id = new_event_id()
    after = int(time.time() * 1000)
    assert before <= id_time_ms(event_id) <= after
    assert id_time_ms(event_id.upper()) == id_time_ms(event_id)  # same time, whatever the case


def test_an_id_without_a_uuidv7_time_is_untimed() -> None:
    v7 = new_event_id()
    for event_id in (
        str(uuid.uuid4()),  # version 4
        "order-17",
        "",
        v7.replace("-", ""),  # not the canonical text form
        "{" + v7 + "}",
        v7[:14] + "7" + v7[15:19] + "c" + v7[20:],  # variant bits not 10
        v7 + " ",
    ):
        assert id_time_ms(event_id) == UNTIMED, event_id


def test_the_time_is_the_first_48_bits() -> None:
    assert id_time_ms("0190a5b2-c3d4-7e5f-8a6b-7c8d9e0f1a2b") == 0x0190A5B2C3D4


def test_ids_made_faster_than_one_per_millisecond_keep_the_clock_s_time() -> None:
    """uuid6's uuid7 added 1 ms per id made within a millisecond: at 5,000 ids/s the ids' time
    ran ahead of the clock by 4 s every second, and the inbox put their claims in partitions
    of the future (the default partition)."""
    ids = [new_event_id() for _ in range(50_000)]  # well over 1,000 per millisecond's worth
    now = int(time.time() * 1000)
    assert id_time_ms(ids[-1]) <= now
    assert ids == sorted(ids) and len(set(ids)) == len(ids)  # still ordered and unique
