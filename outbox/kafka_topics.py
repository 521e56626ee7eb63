"""The partitions of topics, as the broker reports them (one metadata request)."""

from __future__ import annotations

from collections.abc import Sequence

from aiokafka.admin import AIOKafkaAdminClient


async def topic_partitions(
    admin: AIOKafkaAdminClient, topics: Sequence[str] | None = None
) -> dict[str, list[int]]:
    """``{topic: sorted partitions}`` for ``topics`` (default: every topic of the cluster);
    a topic the broker does not know is left out.

    Asked of the broker, not read from a client's metadata cache: aiokafka bootstraps with no
    topics, so a new client's cache knows none until its first refresh.
    """
    described = await admin.describe_topics(list(topics) if topics is not None else None)
    return {
        entry["topic"]: sorted(p["partition"] for p in entry["partitions"])
        for entry in described
        if not entry.get("error_code")
    }
