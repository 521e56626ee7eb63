"""The console clicked through in a real headless Chromium on real PostgreSQL and Kafka.

Each test saves screenshots of the pages it visits into docs/console/ (docs/console.md shows
them).
"""

from __future__ import annotations

import asyncio
import shutil
import time
import uuid
from collections.abc import Iterator

import pytest
from outboxkit.console import ConsoleConfig
from outboxkit.ops.dlq.tables import dlq_replays
from outboxkit.outbox import Outbox, new_event
from outboxkit.outbox.db import make_engine
from outboxkit.outbox.kafka_settings import KafkaSettings
from outboxkit.outbox.tables import outbox_relays
from playwright.sync_api import expect
from sqlalchemy import func, insert, select
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from tests.support import approvals
from tests.support import workflow_ops as w
from tests.support.actions import sessions_for
from tests.support.browser import CHROMIUM, chromium, run_async, screenshot, sign_in
from tests.support.console import OPERATOR_TOKEN, TOKENS, VIEWER_TOKEN, serving
from tests.support.consumers import dead_letters_of_two_causes
from tests.support.ops import end_offsets

pytestmark = pytest.mark.skipif(
    shutil.which(CHROMIUM) is None, reason="needs Debian's chromium (scripts/install.sh)"
)
SECRET = "card-4111-1111-1111-1111"
APP = "tests.support.workflow_ops:build_engine"


def config(db_url: str, bootstrap: str, **extra: object) -> ConsoleConfig:
    return ConsoleConfig(
        db_url=db_url, kafka=KafkaSettings(bootstrap=bootstrap), tokens=TOKENS, **extra
    )  # type: ignore[arg-type]


def write_outbox_rows(db_url: str, n: int, topic: str) -> None:
    engine = make_engine(db_url, poolclass=NullPool)
    outbox = Outbox(default_topic=topic)
    with Session(engine) as session, session.begin():
        for _ in range(n):
            outbox.add(session, new_event("order.placed", "/shop", {"card": SECRET}))
    engine.dispose()


def test_overview_after_a_relay_outage_shows_the_backlog_live_and_a_dead_broker(
    pg_url: str, kafka_bootstrap: str
) -> None:
    # A relay registered, then died: its heartbeat is old and it holds no lease; rows pile up.
    engine = make_engine(pg_url, poolclass=NullPool)
    with engine.begin() as connection:
        old = int(time.time() * 1000) - 600_000
        connection.execute(
            insert(outbox_relays).values(
                relay_id="relay-a", host="host-1", pid=4242, started_ms=old, heartbeat_ms=old
            )
        )
    engine.dispose()
    write_outbox_rows(pg_url, 3, "orders")
    with serving(config(pg_url, kafka_bootstrap, refresh_s=1.0)) as base, chromium() as browser:
        page = browser.new_page()
        sign_in(page, base, VIEWER_TOKEN)
        assert page.inner_text("#backlog") == "3"
        assert "relay-a" in page.inner_text("#card-relays")
        assert page.locator("#unreachable").count() == 0
        write_outbox_rows(pg_url, 2, "orders")  # no reload: the live part refreshes itself
        # (the console's CSP forbids eval, so the wait is a locator, not a JS predicate)
        expect(page.locator("#backlog")).to_have_text("5", timeout=60_000)
        screenshot(page, "overview")
        page.click("#backlog")
        page.wait_for_url(f"{base}/outbox?which=pending")
        assert page.locator("#outbox-rows tr").count() == 1 + 5
        assert SECRET not in page.content()  # rows are listed without their payload
        screenshot(page, "outbox")
    # The broker is down: its sections say so, the database's numbers are still there.
    with serving(config(pg_url, "127.0.0.1:1", timeout=2.0)) as base, chromium() as browser:
        page = browser.new_page()
        sign_in(page, base, VIEWER_TOKEN)
        assert page.inner_text("#backlog") == "5"
        assert "127.0.0.1:1" in page.inner_text("#unreachable")
        assert "unreachable" in page.inner_text("#card-dlq")
        screenshot(page, "overview-broker-down")


@pytest.fixture
def dlq_topics(kafka_bootstrap: str) -> Iterator[tuple[str, str]]:
    topic = f"console-{uuid.uuid4().hex[:10]}"

    asyncio.run(dead_letters_of_two_causes(kafka_bootstrap, topic, {"card": SECRET}))
    yield topic, f"{topic}.dlq"


def test_replaying_a_dead_letter_group_publishes_it_once(
    pg_url: str, kafka_bootstrap: str, dlq_topics: tuple[str, str]
) -> None:
    topic, dlq = dlq_topics
    settings = config(pg_url, kafka_bootstrap, dlq_topics=(dlq,))
    with serving(settings) as base, chromium() as browser:
        page = browser.new_page()
        sign_in(page, base, OPERATOR_TOKEN)
        page.click("#card-dlq a.dlq-count")
        page.wait_for_url(f"{base}/dlq/{dlq}")
        assert page.inner_text("#matched") == "6"
        groups = page.locator("#groups tr.group")
        assert groups.count() == 2
        big = groups.nth(0)
        assert big.locator("td").nth(0).inner_text() == "4"
        fingerprint = big.get_attribute("data-fingerprint")
        screenshot(page, "dlq-groups")

        def replay_group() -> None:
            page.goto(f"{base}/dlq/{dlq}")
            page.click(f"#replay-{fingerprint}")
            page.wait_for_selector("#dry-count")

        replay_group()
        assert page.inner_text("#dry-count strong") == "4"
        assert run_async(end_offsets(kafka_bootstrap, topic)) == [0]  # a dry run sends nothing
        screenshot(page, "dlq-dry-run")
        page.fill("#reason", "limit raised to 100")
        page.click("#confirm")
        page.wait_for_selector("#outcome")
        assert "4 replayed" in page.inner_text("#outcome")
        assert run_async(end_offsets(kafka_bootstrap, topic)) == [4]
        # the second time, the ledger says they went: the dry run finds 0, nothing is sent
        replay_group()
        assert page.inner_text("#dry-count strong") == "0"
        assert "4 already replayed" in page.inner_text("#dry-count")
        assert page.locator("#confirm").count() == 0
        assert run_async(end_offsets(kafka_bootstrap, topic)) == [4]
        # a letter's page shows the payload to an operator
        page.goto(f"{base}/dlq/{dlq}/0/0")
        assert SECRET in page.inner_text("#payload")
        screenshot(page, "dlq-letter-operator")
        # the other group is discarded: counted first, confirmed with a reason, then hidden
        page.goto(f"{base}/dlq/{dlq}")
        other = groups.nth(1).get_attribute("data-fingerprint")
        page.click(f"#discard-{other}")
        page.wait_for_selector("#dry-count")
        assert page.inner_text("#dry-count strong") == "2"
        screenshot(page, "dlq-discard-dry-run")
        page.fill("#reason", "orders re-entered by hand")
        page.click("#confirm")
        page.wait_for_selector("#outcome")
        assert "2 discarded" in page.inner_text("#outcome")
        page.goto(f"{base}/dlq/{dlq}")
        assert page.inner_text("#matched") == "4"
        assert "2 discarded letter(s) in this topic, left out" in page.inner_text("#discarded-note")
        page.goto(f"{base}/audit")
        audit = page.inner_text("#audit")
        assert "dlq.replay" in audit and "limit raised to 100" in audit
        assert "dlq.discard" in audit and "orders re-entered by hand" in audit
        screenshot(page, "audit")
    engine = make_engine(pg_url, poolclass=NullPool)
    with engine.connect() as connection:
        assert connection.scalar(select(func.count()).select_from(dlq_replays)) == 4
    engine.dispose()


def test_a_viewer_sees_no_payload_and_no_action(
    pg_url: str, kafka_bootstrap: str, dlq_topics: tuple[str, str]
) -> None:
    _, dlq = dlq_topics
    with serving(config(pg_url, kafka_bootstrap, dlq_topics=(dlq,))) as base, chromium() as browser:
        page = browser.new_page()
        sign_in(page, base, VIEWER_TOKEN)
        page.goto(f"{base}/dlq/{dlq}")
        assert page.locator("button.replay").count() == 0
        page.goto(f"{base}/dlq/{dlq}/0/0")
        assert page.locator("#payload").count() == 0
        assert page.locator("#payload-hidden").count() == 1
        assert "order 0 exceeds the limit" in page.inner_text("#letter-error")
        for path in ("/dlq/" + dlq, "/dlq/" + dlq + "/0/0", "/", "/outbox", "/actions"):
            page.goto(base + path)
            assert SECRET not in page.content(), path
            assert VIEWER_TOKEN not in page.content() and VIEWER_TOKEN not in page.url
        screenshot(page, "dlq-letter-viewer")
        # pressing a change anyway (a hand-made POST with the page's CSRF token) is refused
        page.goto(f"{base}/outbox?which=parked")
        csrf = page.locator("input[name=csrf]").first.get_attribute("value")
        response = page.request.post(
            f"{base}/outbox/requeue", form={"csrf": csrf, "scope": "all", "reason": "x"}
        )
        assert response.status == 403 and "viewers cannot act" in response.text()


def test_a_post_without_the_csrf_token_is_refused(pg_url: str, kafka_bootstrap: str) -> None:
    with serving(config(pg_url, kafka_bootstrap)) as base, chromium() as browser:
        page = browser.new_page()
        sign_in(page, base, OPERATOR_TOKEN)
        for form in ({"scope": "all", "reason": "x"}, {"scope": "all", "reason": "x", "csrf": "x"}):
            response = page.request.post(f"{base}/outbox/requeue", form=form)
            assert response.status == 403 and "CSRF" in response.text()
        page.goto(f"{base}/audit")
        assert "nothing done in the console yet" in page.inner_text("#audit")


def test_resolving_an_unknown_action_and_resuming_its_workflow(
    pg_url: str, kafka_bootstrap: str
) -> None:
    async def seed() -> None:
        async with sessions_for(pg_url) as sessions:
            engine = w.build_engine(sessions)
            await w.start(engine, "PO-unk", mode="unknown")
            await w.settle(engine, "PO-unk", lambda r: r.wait is not None)
            await w.approve(engine, "PO-unk")
            await w.settle(engine, "PO-unk", lambda r: r.state == "human_review")

    asyncio.run(seed())

    def engine_factory():
        from outboxkit.cli.workflows import load_engine

        return load_engine(APP, pg_url)

    settings = config(pg_url, kafka_bootstrap, workflow_engine=engine_factory)
    with serving(settings) as base, chromium() as browser:
        page = browser.new_page()
        sign_in(page, base, OPERATOR_TOKEN)
        assert page.inner_text("#unknown") == "1"
        page.click("#unknown")
        page.wait_for_url(f"{base}/actions")
        row = page.locator("tr.operation[data-key='PO-unk:issue:v1']")
        assert row.count() == 1
        screenshot(page, "actions")
        row.locator("select[name=resolution]").select_option("succeeded")
        row.locator("input[name=external_ref]").fill("order-77")
        row.locator("input[name=reason]").fill("the supplier confirmed order 77")
        row.locator("button").click()
        page.wait_for_selector("#outcome")
        assert "SUCCEEDED" in page.inner_text("#outcome")
        page.goto(f"{base}/workflows?state=human_review")
        page.click("text=PO-unk")
        page.wait_for_url(f"{base}/workflows/acme/PO-unk")
        assert page.inner_text("#wf-state").startswith("human_review")
        screenshot(page, "workflow")
        page.locator("form.decide:has(#resume) input[name=reason]").fill("order confirmed")
        page.click("#resume")
        page.wait_for_selector("#outcome")
        assert "PO-unk (acme): execute" in page.inner_text("#outcome")
        page.goto(f"{base}/audit")
        audit = page.inner_text("#audit")
        assert "actions.resolve" in audit and "workflows.resume" in audit

    async def history() -> list:
        async with sessions_for(pg_url) as sessions:
            engine = w.build_engine(sessions)
            async with sessions() as session:
                return await engine.history(session, "acme", "PO-unk")

    operator = [h for h in run_async(history()) if h.kind == "operator"]
    assert [(h.actor, h.decision["action"]) for h in operator] == [("otto", "resume")]


def test_the_actions_page_shows_a_pending_approval_with_its_arguments_and_expiry(
    pg_url: str, kafka_bootstrap: str
) -> None:
    args = {"charge_id": "ch_4242", "amount_cents": 1250, "currency": "EUR"}

    async def seed() -> str:
        await approvals.request(
            pg_url, "acme", "ticket-80", {"charge_id": "ch_old"}, ttl_s=3600, age_s=7200
        )
        return await approvals.request(pg_url, "acme", "ticket-81", args, call="call-refund-1")

    digest = run_async(seed())
    with serving(config(pg_url, kafka_bootstrap)) as base, chromium() as browser:
        page = browser.new_page()
        sign_in(page, base, OPERATOR_TOKEN)
        page.goto(f"{base}/actions")
        expect(page.locator("#approvals")).to_contain_text("PENDING approvals: 2")
        rows = page.locator("#pending-approvals tr.approval")
        assert rows.count() == 2
        expect(rows.nth(0)).to_contain_text("ticket-80")
        expect(rows.nth(0)).to_contain_text("expired")
        fresh = page.locator("#pending-approvals tr.approval:has-text('ticket-81')")
        expect(fresh).to_contain_text("call-refund-1")
        expect(fresh).to_contain_text(digest[:16])
        expect(fresh.locator("pre.approval-args")).to_contain_text('"charge_id": "ch_4242"')
        expect(fresh).to_contain_text("(in 2d23h)")
        screenshot(page, "approvals")
        viewer = browser.new_page()
        sign_in(viewer, base, VIEWER_TOKEN)
        viewer.goto(f"{base}/actions")
        expect(viewer.locator("#pending-approvals")).to_contain_text(digest[:16])
        assert "ch_4242" not in viewer.content()
        assert viewer.locator("pre.approval-args").count() == 0
