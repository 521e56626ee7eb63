"""Waiting, without sleeps, until a consumer app has applied everything published so far."""

from __future__ import annotations

import asyncio
import time

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from outboxkit.consumers.app import ConsumerApp
from outboxkit.outbox.kafka_settings import KafkaSettings
from outboxkit.outbox.kafka_topics import topic_partitions

POLL_S = 0.1


async def wait_until_applied(
    app: ConsumerApp,
    kafka: KafkaSettings | str,
    *,
    group: str | None = None,
    timeout_s: float = 60.0,
) -> dict[TopicPartition, int]:
    """Return once ``app``'s group has committed, on every partition of the app's topics, at
    least the end offsets those partitions had when this was called; the consumer commits an
    offset only after the events before it are applied, so those events are applied.

    ``kafka`` is the settings or a bootstrap address; ``group`` defaults to the app's group.
    Raises :class:`TimeoutError` naming the partitions still behind after ``timeout_s``.
    """
    settings = KafkaSettings(bootstrap=kafka) if isinstance(kafka, str) else kafka
    group_id = group or app.group_id
    consumer = AIOKafkaConsumer(**settings.client_options("outboxkit-test-wait"))
    admin = AIOKafkaAdminClient(**settings.client_options("outboxkit-test-wait-admin"))
    await consumer.start()
    await admin.start()
    try:
        partitions = [
            TopicPartition(topic, p)
            for topic, found in (await topic_partitions(admin, list(app.topics))).items()
            for p in found
        ]
        ends = await consumer.end_offsets(partitions) if partitions else {}
        wanted = {tp: end for tp, end in ends.items() if end > 0}
        deadline = time.monotonic() + timeout_s
        while True:
            committed = await admin.list_consumer_group_offsets(group_id)
            behind = {
                tp: (committed[tp].offset if tp in committed else None, end)
                for tp, end in wanted.items()
                if tp not in committed or committed[tp].offset < end
            }
            if not behind:
                return wanted
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"group {group_id} has not applied everything after {timeout_s:g} s: "
                    + ", ".join(
                        f"{tp.topic}[{tp.partition}] committed {at} of {end}"
                        for tp, (at, end) in sorted(behind.items())
                    )
                )
            await asyncio.sleep(POLL_S)
    finally:
        await admin.close()
        await consumer.stop()
