"""The actions page's PENDING approvals, and the stuck-workflow filter's keyset pages, over real
HTTP on real PostgreSQL: requests made through :mod:`outboxkit.agents.approvals`, listed with
their expiry until decided; arguments for operators only; the tenant limit; keyset pages and the
indexes they are read along."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator

import pytest
from outboxkit.actions.tables import agent_operations
from outboxkit.console import ConsoleConfig
from outboxkit.console.security import Tokens
from outboxkit.ops.approvals import waiting_query
from outboxkit.outbox.db import make_engine
from outboxkit.outbox.kafka_settings import KafkaSettings
from outboxkit.workflows.store import instances_query
from outboxkit.workflows.tables import DUE_MS, workflow_instances
from sqlalchemy import Engine, func, select, text
from sqlalchemy.pool import NullPool

from tests.support import workflow_ops as w
from tests.support.approvals import DAY_S, request
from tests.support.console import (
    OPERATOR_TOKEN,
    VIEWER_TOKEN,
    follow_pages,
    serving,
    signed_in,
)

CARD = {"charge_id": "ch_4242", "amount_cents": 1250, "api_key": "sk_live_hidden"}
LIMITED_TOKEN = "limited-token-approvals-0123"


@pytest.fixture
def console_url(pg_url: str) -> Iterator[str]:
    tokens = Tokens.parse(
        [
            f"{OPERATOR_TOKEN} operator otto",
            f"{VIEWER_TOKEN} viewer vera",
            f"{LIMITED_TOKEN} operator lena tenants=acme",
        ],
        "test",
    )
    config = ConsoleConfig(
        db_url=pg_url, kafka=KafkaSettings(bootstrap="127.0.0.1:9"), tokens=tokens, page_size=4
    )
    with serving(config) as base:
        yield base


def approvals_table(page: str) -> str:
    return page.split('id="pending-approvals"')[1].split("</table>")[0]


def rows_of(page: str) -> list[str]:
    return re.findall(r'<tr class="approval[^"]*" data-key="[^"]+">(.*?)</tr>', page, re.S)


def test_waiting_approvals_are_listed_with_expiry_arguments_for_operators_only_and_by_tenant(
    console_url: str, pg_url: str
) -> None:
    async def seed() -> dict[str, str]:
        return {
            "fresh": await request(pg_url, "acme", "ticket-1", CARD),
            "expired": await request(
                pg_url, "acme", "ticket-2", {"charge_id": "ch_old"}, ttl_s=DAY_S, age_s=2 * DAY_S
            ),
            "decided": await request(
                pg_url, "acme", "ticket-3", {"charge_id": "ch_done"}, decided=True
            ),
            "globex": await request(pg_url, "globex", "ticket-9", {"charge_id": "ch_globex"}),
        }

    hashes = asyncio.run(seed())
    with signed_in(console_url, OPERATOR_TOKEN) as client:
        page = client.get("/actions").text
        table = approvals_table(page)
        rows = rows_of(table)
        # oldest request first; the decided one is gone
        assert [re.findall(r"<td>(ticket-\d)</td>", row) for row in rows] == [
            ["ticket-1"], ["ticket-2"], ["ticket-9"],
        ]  # fmt: skip
        assert "PENDING approvals: 3" in page and "ch_done" not in page
        assert "<td>call-0</td><td>refund</td>" in rows[0]
        assert hashes["fresh"][:16] in rows[0] and "ch_4242" in rows[0]
        assert "sk_live_hidden" not in page and "[redacted]" in rows[0]  # secrets never shown
        assert "(in 2d23h)" in rows[0] and "expired" not in rows[0]
        assert 'class="approval expired"' in table and "expired 20" in rows[1]
    with signed_in(console_url, VIEWER_TOKEN) as client:
        page = client.get("/actions").text
        table = approvals_table(page)
        assert len(rows_of(table)) == 3
        assert hashes["fresh"][:16] in table  # the hash, never the values
        for value in ("ch_4242", "1250", "ch_old", "ch_globex", "sk_live_hidden", "Arguments"):
            assert value not in page, value
        assert "the arguments are shown to operators only" in page
    with signed_in(console_url, LIMITED_TOKEN) as client:
        page = client.get("/actions").text
        assert [re.findall(r"<td>(ticket-\d)</td>", row) for row in rows_of(page)] == [
            ["ticket-1"], ["ticket-2"],
        ]  # fmt: skip
        assert "ch_globex" not in page and hashes["globex"][:16] not in page
        assert client.get("/actions", params={"tenant": "globex"}).status_code == 403


def test_waiting_approvals_are_paged_by_keyset_along_their_partial_index(
    console_url: str, pg_url: str
) -> None:
    async def seed() -> None:
        for n in range(10):
            await request(pg_url, "acme", f"run-{n:02d}", {"charge_id": f"ch_{n}"}, decided=n == 3)

    asyncio.run(seed())
    seen: list[str] = []
    with signed_in(console_url, OPERATOR_TOKEN) as client:
        pages = list(follow_pages(client, "/actions", "next-approvals"))
    for page in pages:
        seen += re.findall(r"<td>(run-\d\d)</td>", approvals_table(page))
    assert seen == [f"run-{n:02d}" for n in range(10) if n != 3] and len(pages) == 3
    # With many operations (done effects, a few waiting requests), PostgreSQL reads a page along
    # ix_agent_operations_awaiting: no sort, no scan of the table, first page and later ones.
    engine = make_engine(pg_url, poolclass=NullPool)
    with engine.begin() as connection:
        connection.execute(
            text(
                "INSERT INTO agent_operations (tenant, op_key, generation, action_type, "
                "params_hash, state, attempts, result, needs_attention, created_ms, updated_ms, "
                "expires_ms) SELECT 'acme', 'bulk-' || n, 1, 'payments.refund', 'h', "
                "'SUCCEEDED', 1, '{}', false, n, n, n FROM generate_series(1, 20000) AS n"
            )
        )
        connection.execute(text("ANALYZE agent_operations"))
    assert_index_plan(
        engine,
        [waiting_query(limit=50), waiting_query(limit=50, after=(10_000, 10_000))],
        "Index Scan using ix_agent_operations_awaiting",
    )
    with engine.connect() as connection:
        waiting = connection.scalar(
            select(func.count()).where(agent_operations.c.awaiting_decision.is_(True))
        )
    assert waiting == 9
    engine.dispose()


def test_the_stuck_workflow_filter_is_paged_by_keyset_along_its_index(
    console_url: str, pg_url: str
) -> None:
    asyncio.run(w.start_many(pg_url, 10))  # runnable now, no worker: due, not taken forward
    engine = make_engine(pg_url, poolclass=NullPool)
    with engine.connect() as connection:
        expected = connection.execute(
            select(workflow_instances.c.workflow_id).order_by(DUE_MS, workflow_instances.c.id)
        ).scalars().all()  # fmt: skip
    seen: list[str] = []
    with signed_in(console_url, OPERATOR_TOKEN) as client:
        pages = list(follow_pages(client, "/workflows?stuck_after=0s"))
    for page in pages:
        seen += re.findall(r'<a href="/workflows/acme/[^"]+">([^<]+)</a>', page)
    assert seen == expected and len(seen) == 10 and len(pages) == 3
    with engine.begin() as connection:
        connection.execute(
            text(
                "INSERT INTO workflow_instances (tenant, workflow_id, name, version, state, "
                "status, input_hash, data, attempts, compensations, seq, entered_seq, "
                "run_at_ms, state_since_ms, created_ms, updated_ms) SELECT 'acme', 'bulk-' || n, "
                "'po', 1, 'execute', CASE WHEN n % 3 = 0 THEN 'done' ELSE 'runnable' END, 'h', "
                "'{}', 0, '[]', 0, 0, n, n, n, n FROM generate_series(1, 20000) AS n"
            )
        )
        connection.execute(text("ANALYZE workflow_instances"))
    assert_index_plan(
        engine,
        [
            instances_query(due_before_ms=5_000, limit=50),
            instances_query(due_before_ms=5_000, limit=50, after=(2_000, 2_000)),
        ],
        "Index Scan using ix_workflow_instances_due_keyset",
    )
    engine.dispose()


def assert_index_plan(engine: Engine, queries: list, index_scan: str) -> None:
    with engine.connect() as connection:
        for query in queries:
            sql = str(query.compile(dialect=engine.dialect, compile_kwargs={"literal_binds": True}))
            plan = "\n".join(connection.execute(text("EXPLAIN " + sql)).scalars())
            assert index_scan in plan, plan
            assert "Sort" not in plan and "Seq Scan" not in plan, plan
