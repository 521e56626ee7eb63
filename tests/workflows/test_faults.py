"""Fault tests of durable workflows on real PostgreSQL (and Kafka), with the test refund flow.

Each test breaks something a real run meets (a worker killed around the provider's commit,
events twice and early, a credential revoked during the pause, the record changed after its
approval, a late callback, a broken compensation, a cancel at each moment) and asserts the
business outcome: refunds at the provider, operations in the ledger, the instance's state and
history. The release criteria of issue 16 are checked at the end, one test each.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from outboxkit.actions import ActionStore, Found, Resolution, State
from outboxkit.workflows import WorkflowWorker
from outboxkit.workflows.store import list_instances

from examples.refund_agent.payments import PaymentsClient
from examples.refund_agent.provider import Fault, PaymentProvider
from tests.support import workflow_worker
from tests.support import workflows as wf
from tests.support.actions import in_tx, kill_once_the_provider_committed
from tests.support.consumers import binary_record, produce, running
from tests.support.kafka import wait_for
from tests.support.waits import scaled

T = wf.TENANT
LEASE_S = 3.0  # instance lease of the crash tests' workers
ACTION_LEASE_S = 2.0
LEDGER = ActionStore()


@pytest.fixture(autouse=True)
def world() -> wf.World:
    return wf.reset_world()


@pytest.fixture
def provider() -> Any:
    with PaymentProvider() as running_provider:
        yield running_provider


class Clock:
    """The engine's business clock, moved by the test."""

    def __init__(self) -> None:
        import time

        self.now = time.time()

    def __call__(self) -> float:
        return self.now


async def operation(engine: Any, key: str) -> Any:
    return await in_tx(engine.sessions, lambda s: LEDGER.get(s, T, key))


async def run_until(engine: Any, workflow_id: str, ready: Any, what: str) -> Any:
    """Tick the engine until ``ready(record)``."""

    async def probe() -> Any:
        record = await wf.get(engine, workflow_id)
        if not ready(record):
            await engine.run_due()
        return record

    return await wait_for(probe, ready, 30, what)


def refund_key(workflow_id: str) -> str:
    return f"{workflow_id}:refund:v1"


# -- kill the worker before and after the tool commits -------------------------------------


@pytest.mark.parametrize("fault", [Fault.HOLD_BEFORE_COMMIT, Fault.HOLD_AFTER_COMMIT])
async def test_worker_killed_around_the_providers_commit(
    pg_url: str, provider: Any, fault: Fault
) -> None:
    """A worker process SIGKILLed while the provider holds the refund (before or after its
    commit); another worker process finishes: one refund, the instance completes."""
    hold = provider.inject(fault)
    async with wf.engine_on(pg_url, lease_s=LEASE_S, action_lease_s=ACTION_LEASE_S) as engine:
        await wf.start(engine, "R-1", wf.refund_input(provider.url))
        await wf.approve(engine, "R-1")  # accepted: the next step is the refund
        first = workflow_worker.start(pg_url, lease_s=LEASE_S, action_lease_s=ACTION_LEASE_S)
        await kill_once_the_provider_committed(first, hold, f"the refund to reach {fault}")
        crashed = await operation(engine, refund_key("R-1"))
        assert crashed.state is State.RUNNING  # the worker died before recording anything
        second = workflow_worker.start(pg_url, lease_s=LEASE_S, action_lease_s=ACTION_LEASE_S)
        try:
            done = await wait_for(
                lambda: wf.get(engine, "R-1"), lambda r: r.state == "complete", 60, "completion"
            )
        finally:
            workflow_worker.stop(second)
        op = await operation(engine, refund_key("R-1"))
        assert op.state is State.SUCCEEDED and op.result["id"] == done.data["refund_id"]
        steps = [s for r in await wf.history(engine, "R-1") for s in r.steps]
        assert [s["key"] for s in steps] == ["R-1:refund:v1", "R-1:notify"]
    assert provider.refund_count() == 1
    assert [r["idempotency_key"] for r in provider.refunds()] == ["R-1:refund:v1:g1"]


# -- deliver events several times, and out of order ----------------------------------------


async def test_signals_through_kafka_twice_and_before_the_wait(
    pg_url: str, kafka_bootstrap: str, topic: str, provider: Any
) -> None:
    """An approval sent before the workflow waits for it is kept pending and resumes the wait
    when it begins; its three copies on Kafka are taken once."""
    async with wf.engine_on(pg_url, signals_topic=topic, events_topic=f"{topic}-events") as engine:
        record = await wf.start(engine, "R-k", wf.refund_input(provider.url))
        request = wf.approval_request(record.data["input"], 1)
        # the wait will be the state's first visit, entered at seq 2: its correlation is known
        early = wf.approval(record, request, id="approval-1", correlation="R-k:await_approval:2")
        await produce(kafka_bootstrap, topic, [binary_record(early)] * 3)
        async with running(engine.consumer_app(), pg_url, kafka_bootstrap) as (_, task):
            signals = await wait_for(
                lambda: _signals(engine, "R-k"), lambda s: len(s) == 1, 60, "the signal"
            )
            assert signals[0].outcome == "pending"  # no wait yet: kept
            done = await run_until(engine, "R-k", lambda r: r.terminal, "the workflow to end")
            assert done.state == "complete"
            # a late duplicate with a new id for the same wait, after the end
            late = wf.approval(record, request, id="approval-2", correlation="R-k:await_approval:2")
            await produce(kafka_bootstrap, topic, [binary_record(late), binary_record(early)])
            signals = await wait_for(
                lambda: _signals(engine, "R-k"), lambda s: len(s) == 2, 60, "the late signal"
            )
            assert not task.done()
        assert [(s.event_id, s.outcome) for s in signals] == [
            ("approval-1", "consumed"),
            ("approval-2", "late"),
        ]
        kinds = [r.kind for r in await wf.history(engine, "R-k")]
        assert kinds.count("resume") == 1 and kinds[-1] == "complete"
    assert provider.refund_count() == 1


async def _signals(engine: Any, workflow_id: str) -> list[Any]:
    async with engine.sessions() as session:
        return await engine.signals(session, T, workflow_id)


# -- expire or revoke credentials during a pause -------------------------------------------


async def test_a_signal_signed_with_a_revoked_key_is_refused(pg_url: str, provider: Any) -> None:
    async with wf.engine_on(pg_url) as engine:
        await wf.start(engine, "R-2", wf.refund_input(provider.url))
        waiting = await run_until(engine, "R-2", lambda r: r.wait is not None, "the wait")
    # the approvals key is rotated during the pause: the old one is revoked
    rotated = {wf.APPROVALS: b"the-new-key"}
    async with wf.engine_on(pg_url, verifier_keys=rotated) as engine:
        request = wf.approval_request(waiting.data["input"], 1)
        refused = await wf.deliver(engine, wf.approval(waiting, request))
        assert (refused.outcome, refused.reason) == ("rejected", "not authenticated")
        await wf.settle(engine)
        assert (await wf.get(engine, "R-2")).state == "await_approval"
        accepted = await wf.deliver(engine, wf.approval(waiting, request, key=b"the-new-key"))
        assert accepted.outcome == "accepted"
        assert (await wf.until_state(engine, "R-2", {"complete"})).state == "complete"
    assert provider.refund_count() == 1


async def test_a_credential_revoked_during_the_pause_goes_to_human_review(
    pg_url: str, provider: Any, world: wf.World
) -> None:
    """The refund's credential is revoked while the workflow waits for its approval: the call
    is refused once, the workflow asks a person, and the token is never used again."""
    async with wf.engine_on(pg_url) as engine:
        await wf.start(engine, "R-3", wf.refund_input(provider.url))
        await run_until(engine, "R-3", lambda r: r.wait is not None, "the wait")
        world.revoked.add("tok-ch_1")
        await wf.approve(engine, "R-3")
        review = await wf.until_state(engine, "R-3", {"human_review", "failed", "complete"})
        assert review.state == "human_review"
        assert review.failure_class == "authorization" and review.review_from == "execute"
        assert "AuthorizationError" in (review.last_error or "")
        for _ in range(5):
            await engine.run_due()
        assert world.token_uses == {"tok-ch_1": 1}
        assert (await wf.get(engine, "R-3")).state == "human_review"
        assert provider.refund_count() == 0
        assert (await operation(engine, refund_key("R-3"))).state is State.PENDING  # not done
        # a person restores the authority and resumes: the refund runs, once
        world.revoked.discard("tok-ch_1")
        await in_tx(
            engine.sessions,
            lambda s: engine.resume(s, T, "R-3", by="ops", reason="token renewed"),
        )
        assert (await wf.until_state(engine, "R-3", {"complete", "human_review"})).state == (
            "complete"
        )
    assert provider.refund_count() == 1


# -- change the record after approval and before commit ------------------------------------


async def test_the_record_changed_after_its_approval_goes_back_to_approval(
    pg_url: str, provider: Any, world: wf.World
) -> None:
    async with wf.engine_on(pg_url) as engine:
        await wf.start(engine, "R-4", wf.refund_input(provider.url))
        await wf.approve(engine, "R-4")
        await wf.until_state(engine, "R-4", {"execute"})
        world.record_versions["R-4"] = 2  # the record changes between approval and refund
        back = await run_until(engine, "R-4", lambda r: r.wait is not None, "the new wait")
        assert back.state == "await_approval" and back.approval is None
        kinds = [r.kind for r in await wf.history(engine, "R-4")]
        assert kinds[-2:] == ["approval_stale", "wait"]
        assert await operation(engine, refund_key("R-4")) is None  # no effect was attempted
        # the approval of the old version is refused (fail closed on a stale record version)
        stale = wf.approval(back, wf.approval_request(back.data["input"], 1))
        assert (await wf.deliver(engine, stale)).outcome == "rejected"
        await wf.approve(engine, "R-4")
        assert (await wf.until_state(engine, "R-4", {"complete"})).state == "complete"
    assert provider.refund_count() == 1


# -- a callback after its deadline ---------------------------------------------------------


@pytest.mark.parametrize("on_deadline", ["expired", "human_review"])
async def test_a_callback_after_its_deadline_is_late(
    pg_url: str, provider: Any, on_deadline: str
) -> None:
    clock = Clock()
    async with wf.engine_on(pg_url, clock=clock) as engine:
        inputs = wf.refund_input(provider.url, approval_deadline_s=60, on_deadline=on_deadline)
        await wf.start(engine, "R-5", inputs)
        waiting = await run_until(engine, "R-5", lambda r: r.wait is not None, "the wait")
        clock.now += 61  # the approver answers a minute late, before any worker noticed
        request = wf.approval_request(waiting.data["input"], 1)
        late = await wf.deliver(engine, wf.approval(waiting, request))
        assert late.outcome == "late" and "deadline" in (late.reason or "")
        ended = await wf.until_state(engine, "R-5", {on_deadline})
        kinds = [r.kind for r in await wf.history(engine, "R-5")]
        assert kinds[-1] == "deadline" and "resume" not in kinds
        assert ended.state == on_deadline
        assert await operation(engine, refund_key("R-5")) is None
    assert provider.refund_count() == 0


# -- break a compensation ------------------------------------------------------------------


async def test_a_broken_compensation_goes_to_human_review_then_an_operator_finishes_it(
    pg_url: str, provider: Any, world: wf.World
) -> None:
    async with wf.engine_on(pg_url) as engine:
        await wf.start(engine, "R-6", wf.refund_input(provider.url))
        await wf.approve(engine, "R-6")
        refunded = await wf.until_state(engine, "R-6", {"notify"})
        world.reversal_broken = True
        await _cancel(engine, "R-6")
        review = await wf.until_state(engine, "R-6", {"human_review", "cancelled"})
        undo_key = "R-6:refund:v1:undo"
        # visible: the class, the error, where it stopped, the open operation
        assert review.state == "human_review" and review.review_from == "compensating"
        assert review.failure_class == "unknown_outcome" and review.open_unknown == undo_key
        assert "reversal service answered 502" in (review.last_error or "")
        assert [c.effect_key for c in review.compensations] == ["R-6:refund:v1"]
        kinds = [r.kind for r in await wf.history(engine, "R-6")]
        assert kinds[-1] == "compensation_failed"
        # the operator fixes the reversal service, lets the reversal run again, resumes
        world.reversal_broken = False
        await in_tx(
            engine.sessions,
            lambda s: LEDGER.resolve(
                s, tenant=T, key=undo_key, resolution=Resolution.RETRY, by="ops", reason="fixed"
            ),
        )
        await in_tx(
            engine.sessions,
            lambda s: engine.resume(s, T, "R-6", by="ops", reason="reversal service fixed"),
        )
        done = await wf.until_state(engine, "R-6", {"cancelled"})
        assert done.compensations == []
        assert world.reversals == [refunded.data["refund_id"]]
        history = await wf.history(engine, "R-6")
        keys = [s["key"] for r in history for s in r.steps]
        assert keys == ["R-6:refund:v1", undo_key]  # the effect and its compensation
    assert provider.refund_count() == 1


async def _cancel(engine: Any, workflow_id: str) -> Any:
    return await in_tx(
        engine.sessions, lambda s: engine.cancel(s, T, workflow_id, by="ops", reason="test")
    )


# -- cancel in queued, running and unknown -------------------------------------------------


async def test_cancel_while_queued_executes_nothing(pg_url: str, provider: Any) -> None:
    async with wf.engine_on(pg_url) as engine:
        await wf.start(engine, "R-7", wf.refund_input(provider.url))
        await _cancel(engine, "R-7")
        done = await wf.until_state(engine, "R-7", {"cancelled"})
        history = await wf.history(engine, "R-7")
        assert [r.kind for r in history] == ["start", "cancel"]
        assert all(not r.steps for r in history) and done.compensations == []
    assert provider.refund_count() == 0


async def test_cancel_while_running_lets_the_effect_finish_then_compensates(
    pg_url: str, provider: Any, world: wf.World
) -> None:
    async with wf.engine_on(pg_url) as engine:
        await wf.start(engine, "R-8", wf.refund_input(provider.url))
        await wf.approve(engine, "R-8")
        await wf.until_state(engine, "R-8", {"execute"})
        world.effect_gate = asyncio.Event()
        step = asyncio.create_task(engine.run_due())
        await asyncio.wait_for(
            world.effect_started.wait(), scaled(30)
        )  # the refund call is in flight
        await _cancel(engine, "R-8")
        world.effect_gate.set()
        assert await step == 1
        done = await wf.until_state(engine, "R-8", {"cancelled"})
        kinds = [r.kind for r in await wf.history(engine, "R-8")]
        assert kinds[-2:] == ["cancel", "compensate"]
        refund = provider.refunds()[0]
        assert world.reversals == [refund["id"]] and done.data["refund_id"] == refund["id"]
        assert world.notifications == []  # no new effect started after the cancel
    assert provider.refund_count() == 1


@pytest.mark.parametrize(
    ("fault", "lookup_down", "expected"),
    [
        (Fault.DROP_AFTER_COMMIT, False, "found"),
        (Fault.DROP_BEFORE_COMMIT, False, "absent"),
        (Fault.DROP_AFTER_COMMIT, True, "unclear"),
    ],
)
async def test_cancel_with_an_unknown_outcome_reconciles_first(
    pg_url: str, provider: Any, world: wf.World, fault: Fault, lookup_down: bool, expected: str
) -> None:
    provider.inject(fault)
    async with wf.engine_on(pg_url) as engine:
        await wf.start(engine, "R-9", wf.refund_input(provider.url))
        await wf.approve(engine, "R-9")
        unknown = await run_until(
            engine, "R-9", lambda r: r.open_unknown is not None, "the unknown outcome"
        )
        assert unknown.state == "execute" and unknown.open_unknown == refund_key("R-9")
        world.lookup_down = lookup_down
        await _cancel(engine, "R-9")
        done = await wf.until_state(engine, "R-9", {"cancelled", "human_review"})
        op = await operation(engine, refund_key("R-9"))
        if expected == "found":  # it took effect: compensated
            assert done.state == "cancelled" and op.state is State.SUCCEEDED
            assert world.reversals == [provider.refunds()[0]["id"]]
        elif expected == "absent":  # it did not: cancelled, nothing to compensate
            assert done.state == "cancelled" and op.state is State.PENDING
            assert world.reversals == [] and provider.refund_count() == 0
        else:  # nobody can tell: a person decides, and the cancel stays asked for
            assert done.state == "human_review" and op.state is State.UNKNOWN
            assert done.open_unknown == refund_key("R-9")
            assert done.cancel_requested_ms is not None
            assert world.reversals == []
    assert world.token_uses == {"tok-ch_1": 1}  # never called again


# -- release criteria ----------------------------------------------------------------------


async def test_release_no_duplicate_significant_effect(pg_url: str, provider: Any) -> None:
    """Two workers, every approval delivered twice: one refund per workflow."""
    ids = [f"R-d{n}" for n in range(6)]
    async with wf.engine_on(pg_url) as engine:
        for workflow_id in ids:
            await wf.start(engine, workflow_id, wf.refund_input(provider.url, f"ch_{workflow_id}"))
        for workflow_id in ids:
            waiting = await run_until(engine, workflow_id, lambda r: r.wait is not None, "wait")
            event = wf.approval(waiting, wf.approval_request(waiting.data["input"], 1))
            assert (await wf.deliver(engine, event)).outcome == "accepted"
            assert await wf.deliver(engine, event) is None  # the duplicate changes nothing
        workers = [WorkflowWorker(engine, poll_interval_s=0.1, batch=2) for _ in range(2)]
        for worker in workers:
            await worker.start()
        try:
            for workflow_id in ids:
                await wait_for(
                    lambda w=workflow_id: wf.get(engine, w),
                    lambda r: r.state == "complete",
                    60,
                    f"{workflow_id} to complete",
                )
        finally:
            for worker in workers:
                await worker.stop()
    keys = sorted(r["idempotency_key"] for r in provider.refunds())
    assert keys == sorted(f"{w}:refund:v1:g1" for w in ids)


async def test_release_a_key_and_a_reconciliation_path_for_every_write(
    pg_url: str, provider: Any
) -> None:
    """Every effect in the history (the compensation too) has a key and a ledger operation;
    the refund is found again by its key at the provider."""
    async with wf.engine_on(pg_url) as engine:
        await wf.start(engine, "R-10", wf.refund_input(provider.url))
        await wf.approve(engine, "R-10")
        await wf.until_state(engine, "R-10", {"notify"})
        await _cancel(engine, "R-10")
        await wf.until_state(engine, "R-10", {"cancelled"})
        steps = [s for r in await wf.history(engine, "R-10") for s in r.steps]
        assert {s["action_type"] for s in steps} == {"payments.refund", "payments.reverse"}
        for step in steps:
            assert step["key"]
            op = await operation(engine, step["key"])
            assert op is not None and op.state is State.SUCCEEDED
            assert op.action_type == step["action_type"] and op.result == step["result"]
        refund = await operation(engine, refund_key("R-10"))
        found = await PaymentsClient(provider.url, account=T).reconcile(refund)
        assert isinstance(found, Found) and found.external_ref == refund.result["id"]


@pytest.mark.parametrize("state", wf.STATES)
async def test_release_every_stored_state_resumes_on_another_worker(
    pg_url: str, provider: Any, state: str
) -> None:
    """Stop once the instance is stored in ``state``; a fresh engine and worker finish it."""
    async with wf.engine_on(pg_url) as engine:
        await wf.start(engine, "R-11", wf.refund_input(provider.url))
        if state in ("execute", "notify"):
            await wf.approve(engine, "R-11")
        await run_until(engine, "R-11", lambda r: r.state == state, state)
    async with wf.engine_on(pg_url) as fresh:
        async with WorkflowWorker(fresh, poll_interval_s=0.1):
            if state in ("intake", "await_approval"):
                await wf.approve(fresh, "R-11")
            done = await wait_for(
                lambda: wf.get(fresh, "R-11"), lambda r: r.terminal, 60, "the end"
            )
        assert done.state == "complete"
    assert provider.refund_count() == 1


async def test_release_fail_closed_on_approval_policy_identity(
    pg_url: str, provider: Any, world: wf.World
) -> None:
    async with wf.engine_on(pg_url) as engine:
        await wf.start(engine, "R-12", wf.refund_input(provider.url))
        waiting = await run_until(engine, "R-12", lambda r: r.wait is not None, "the wait")
        request = wf.approval_request(waiting.data["input"], 1)
        other = {**request, "amount_cents": 999_999}
        refused = [
            await wf.deliver(engine, wf.approval(waiting, other)),  # approves another request
            await wf.deliver(engine, wf.approval(waiting, request, key=b"forged")),  # identity
            await wf.deliver(engine, wf.approval(waiting, request, source="intern")),
            await wf.deliver(engine, wf.approval(waiting, request, correlation="R-12:x:99")),
        ]
        assert [s.outcome for s in refused] == ["rejected"] * 4
        await wf.settle(engine)
        assert (await wf.get(engine, "R-12")).state == "await_approval"
        # an operator sending it to execute without an approval: refused by the handler
        await in_tx(engine.sessions, lambda s: engine.escalate(s, T, "R-12", by="ops", reason="x"))
        await in_tx(
            engine.sessions,
            lambda s: engine.resume(s, T, "R-12", by="ops", reason="skip", to_state="execute"),
        )
        review = await wf.until_state(engine, "R-12", {"human_review", "complete", "failed"})
        assert review.state == "human_review" and review.failure_class == "policy"
        # a policy refusal is never retried
        await wf.start(engine, "R-13", wf.refund_input(provider.url, "ch_13"))
        world.policy_refuses = True
        await wf.approve(engine, "R-13")
        review = await wf.until_state(engine, "R-13", {"human_review", "complete", "failed"})
        assert review.state == "human_review" and review.failure_class == "policy"
        assert [r.kind for r in await wf.history(engine, "R-13")].count("failure") == 1
    assert provider.refund_count() == 0


@pytest.mark.parametrize("where", ["handler", "effect"])
async def test_release_no_runaway_load(
    pg_url: str, provider: Any, world: wf.World, where: str
) -> None:
    """A permanently failing instance makes a bounded number of attempts, then stops."""
    clock = Clock()
    definition = wf.build(1, max_attempts=3)
    async with wf.engine_on(pg_url, [definition], clock=clock) as engine:
        if where == "handler":
            world.intake_transient = True
        else:
            world.refund_transient = True
        await wf.start(engine, "R-14", wf.refund_input(provider.url))
        if where == "effect":
            await wf.approve(engine, "R-14")
        for _ in range(30):  # far more ticks, and time, than the budget allows
            await engine.run_due()
            clock.now += 5
            await asyncio.sleep(0.02)
        record = await wf.get(engine, "R-14")
    if where == "handler":
        assert world.calls["intake"] == 3  # Budget.max_attempts
        assert record.state == "human_review" and record.failure_class == "transient"
    else:
        # the ledger's 3 tries in the first run, then 1 in each later run of the budget's 3;
        # the operation stays PENDING (it never happened) for a person to resume later
        assert world.calls["refund"] == 5
        assert record.state == "human_review" and record.failure_class == "transient"
    assert provider.refund_count() == 0


async def test_release_every_unknown_is_findable_and_resolvable(
    pg_url: str, provider: Any, world: wf.World
) -> None:
    provider.inject(Fault.DROP_AFTER_COMMIT)
    world.lookup_down = True
    async with wf.engine_on(pg_url) as engine:
        await wf.start(engine, "R-15", wf.refund_input(provider.url))
        await wf.approve(engine, "R-15")
        await wf.until_state(engine, "R-15", {"human_review"})
        # findable: the instance in human_review names the open operation
        async with engine.sessions() as session:
            [found] = await list_instances(session, tenant=T, states=["human_review"])
        assert found.workflow_id == "R-15" and found.open_unknown == refund_key("R-15")
        assert found.failure_class == "unknown_outcome"
        op = await operation(engine, found.open_unknown)
        assert op.state is State.UNKNOWN
        # resolvable: the operator checks the provider, records the refund, resumes
        [refund] = provider.refunds()
        await in_tx(
            engine.sessions,
            lambda s: LEDGER.resolve(
                s,
                tenant=T,
                key=found.open_unknown,
                resolution=Resolution.SUCCEEDED,
                by="ops",
                reason="found at the provider",
                result=refund,
                external_ref=refund["id"],
            ),
        )
        await in_tx(engine.sessions, lambda s: engine.resume(s, T, "R-15", by="ops", reason="ok"))
        done = await wf.until_state(engine, "R-15", {"complete"})
        assert done.data["refund_id"] == refund["id"] and done.open_unknown is None
    assert provider.refund_count() == 1
