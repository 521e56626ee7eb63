"""The console keeps its Kafka clients across pages: a broker that stops shows as unreachable
on the overview (the page still answers, with the database's numbers), and once it is back the
console connects again by itself. A dead-letter topic's page groups its newest letters only,
says so, and its replay still counts every letter the filter matches."""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections.abc import Callable

import httpx
from outboxkit.console import ConsoleConfig
from outboxkit.outbox.kafka_settings import KafkaSettings
from outboxkit.testing.kafka import KafkaBroker

from tests.support.console import OPERATOR_TOKEN, TOKENS, csrf_of, serving, signed_in
from tests.support.consumers import dead_letters_of_two_causes

DEADLINE_S = 120.0  # a loaded machine, a broker restart and the console's backoff (30 s at most)


def dlq_card(client: httpx.Client) -> str:
    response = client.get("/overview/live")
    assert response.status_code == 200, response.text  # never a failed page
    card = response.text.split('id="card-dlq"')[1].split("</section>")[0]
    return card


def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        assert time.monotonic() < deadline, f"not within {DEADLINE_S:g} s: {what}"
        time.sleep(0.2)


def test_a_broker_that_stops_shows_unreachable_and_is_reconnected_when_back(
    pg_url: str, own_kafka: KafkaBroker
) -> None:
    dlq = asyncio.run(
        dead_letters_of_two_causes(own_kafka.bootstrap, f"kept-{uuid.uuid4().hex[:8]}")
    )
    config = ConsoleConfig(
        db_url=pg_url,
        kafka=KafkaSettings(bootstrap=own_kafka.bootstrap),
        tokens=TOKENS,
        dlq_topics=(dlq,),
        timeout=3.0,
        report_ttl_s=0.0,
    )
    counted = re.compile(r'class="dlq-count"[^>]*>6</a>')
    with serving(config) as base, signed_in(base, OPERATOR_TOKEN) as client:
        assert counted.search(dlq_card(client))
        own_kafka.stop()
        wait_until(lambda: "unreachable" in dlq_card(client), "the broker shown unreachable")
        page = client.get("/overview/live").text
        assert own_kafka.bootstrap in page.split('id="unreachable"')[1]
        assert 'id="backlog"' in page  # the database's numbers are still there
        own_kafka.start()
        wait_until(lambda: bool(counted.search(dlq_card(client))), "the dead letters counted again")
        assert client.get(f"/dlq/{dlq}").status_code == 200  # the letters read again too


def test_a_topic_page_groups_its_newest_letters_and_the_replay_counts_them_all(
    pg_url: str, kafka_bootstrap: str
) -> None:
    dlq = asyncio.run(dead_letters_of_two_causes(kafka_bootstrap, f"sample-{uuid.uuid4().hex[:8]}"))
    config = ConsoleConfig(
        db_url=pg_url, kafka=KafkaSettings(bootstrap=kafka_bootstrap), tokens=TOKENS, dlq_sample=3
    )
    with serving(config) as base, signed_in(base, OPERATOR_TOKEN) as client:
        page = client.get(f"/dlq/{dlq}").text
        # the newest 3 of 6: Limit order 3 (offset 3), Timeout orders 10 and 11 (offsets 4, 5)
        assert '<span id="matched">3</span>' in page
        assert "grouped from the newest 3 of 6" in page
        counts = re.findall(r'<tr class="group"[^>]*><td>(\d+)</td><td>([^<]*)</td>', page)
        assert sorted(counts) == [("1", "permanent:Limit"), ("2", "exhausted:Timeout")]
        asked = client.post(f"/dlq/{dlq}/replay", data={"csrf": csrf_of(page)}).text
        assert "<strong>6</strong> record(s) would be replayed" in asked
