"""run_action and the example's refund step against a real HTTP payment provider, on SQLite and
PostgreSQL.

Every test asserts the provider's own count of refunds and the events written to the outbox
(rows of ``outbox_events``; ``test_actions_kafka.py`` follows them into Kafka).
"""

from __future__ import annotations

import asyncio

import pytest
from outboxkit.actions import (
    ActionFailedError,
    ActionOutcomeUnknownError,
    ActionStore,
    OperationConflictError,
    Resolution,
    State,
    reconcile_unknown,
    run_action,
)
from outboxkit.outbox import OutcomeUnknownError, RetryPolicy, TransientError
from outboxkit.outbox.backoff import Backoff
from outboxkit.outbox.clock import db_now_ms
from sqlalchemy import select

from examples.refund_agent.agent import Refund, Ticket
from examples.refund_agent.payments import PaymentsClient
from examples.refund_agent.provider import Fault, PaymentProvider
from tests.support.actions import RefundSteps, event_types, in_tx, sessions_for
from tests.support.kafka import wait_for

T = "acme"
TICKET = Ticket(ticket_id="T-1", charge_id="ch_1", amount_cents=1999)
FAST = RetryPolicy(max_attempts=3, backoff=Backoff(base_s=0.01, cap_s=0.05))
FAST_POLL = Backoff(base_s=0.01, cap_s=0.1, floor_s=0.01)


def refunds_for(sessions, store, provider, **options) -> RefundSteps:
    return RefundSteps(sessions, store, provider.url, retry=FAST, poll_backoff=FAST_POLL, **options)


def provider_refund(provider: PaymentProvider, index: int = 0) -> Refund:
    return Refund.model_validate(provider.refunds()[index])


async def test_lost_reply_after_the_refund_then_retry_makes_one_refund(db_url: str) -> None:
    store = ActionStore()
    with PaymentProvider() as provider:
        async with sessions_for(db_url) as sessions:
            refund = refunds_for(sessions, store, provider)
            key = refund.key(TICKET)
            provider.inject(Fault.DROP_AFTER_COMMIT)
            with pytest.raises(ActionOutcomeUnknownError) as raised:
                await refund(TICKET)
            assert raised.value.record.state is State.UNKNOWN
            assert provider.refund_count() == 1

            retried = await refund(TICKET)  # the agent retries the step
            assert retried.operation.state is State.SUCCEEDED and not retried.executed
            assert retried.value == provider_refund(provider)
            assert retried.operation.external_ref == "re_000001"

            again = await refund(TICKET)
            assert again.value == retried.value and not again.executed
        assert provider.refund_count() == 1 and provider.replays == 0
    assert event_types(db_url, T, key) == ["requested", "started", "unknown", "reconciled"]


async def test_without_a_reconciler_an_unknown_outcome_is_never_retried(db_url: str) -> None:
    store = ActionStore()
    with PaymentProvider() as provider:
        payments = PaymentsClient(provider.url, account=T)
        calls = []

        async def refund(key: str):
            calls.append(key)
            return await payments.refund(key, charge_id="ch_1", amount_cents=5, currency="EUR")

        request = {"tenant": T, "key": "k-1", "action_type": "refund", "params": {"a": 5}}
        async with sessions_for(db_url) as sessions:
            provider.inject(Fault.DROP_AFTER_COMMIT)
            for _ in range(3):
                with pytest.raises(ActionOutcomeUnknownError) as raised:
                    await run_action(sessions, store, refund, timeout_s=10, retry=FAST, **request)
                # the ledger's error is the kernel's "outcome unknown" too: one except covers both
                assert isinstance(raised.value, OutcomeUnknownError)
        assert calls == ["k-1:g1"] and provider.refund_count() == 1
    assert event_types(db_url, T, "k-1") == ["requested", "started", "unknown"]


async def test_timeout_is_unknown_unclear_while_in_flight_then_reconciled(db_url: str) -> None:
    store = ActionStore()
    with PaymentProvider() as provider:
        hold = provider.inject(Fault.HOLD_BEFORE_COMMIT)
        async with sessions_for(db_url) as sessions:
            refund = refunds_for(sessions, store, provider, timeout_s=0.5)
            key = refund.key(TICKET)
            with pytest.raises(ActionOutcomeUnknownError):
                await refund(TICKET)
            assert hold.reached.is_set()

            # the request is still in flight at the provider: the reconciler cannot tell
            [flagged] = await reconcile_unknown(sessions, store, refund.payments.reconcile)
            assert flagged.state is State.UNKNOWN and flagged.needs_attention

            hold.release()
            await wait_for(provider.refund_count, lambda n: n == 1, 10, "the held refund")
            [done] = await reconcile_unknown(sessions, store, refund.payments.reconcile)
            assert done.state is State.SUCCEEDED and not done.needs_attention
            assert done.result == provider.refunds()[0]
            assert (await refund(TICKET)).value == provider_refund(provider)
        assert provider.refund_count() == 1
    assert event_types(db_url, T, key) == [
        "requested",
        "started",
        "unknown",
        "flagged",
        "reconciled",
    ]


async def test_restart_resumes_an_unknown_operation_proven_absent(db_url: str) -> None:
    with PaymentProvider() as provider:
        provider.inject(Fault.DROP_BEFORE_COMMIT)  # connection lost, nothing committed
        async with sessions_for(db_url) as sessions:
            refund = refunds_for(sessions, ActionStore(), provider)
            key = refund.key(TICKET)
            with pytest.raises(ActionOutcomeUnknownError):
                await refund(TICKET)
        assert provider.refund_count() == 0

        # a restarted agent: new engine, new store, same workflow run and step
        async with sessions_for(db_url) as sessions:
            resumed = await refunds_for(sessions, ActionStore(), provider)(TICKET)
        assert resumed.executed and resumed.operation.attempts == 2
        assert provider.refund_count() == 1
    assert event_types(db_url, T, key) == [
        "requested",
        "started",
        "unknown",
        "reconciled",
        "started",
        "succeeded",
    ]


async def test_same_key_with_other_parameters_is_refused_before_any_call(db_url: str) -> None:
    store = ActionStore()
    with PaymentProvider() as provider:
        async with sessions_for(db_url) as sessions:
            refund = refunds_for(sessions, store, provider)
            key = refund.key(TICKET)
            await refund(TICKET)

            async def call(idempotency_key: str):
                raise AssertionError("must not be called")

            with pytest.raises(OperationConflictError):
                await run_action(
                    sessions,
                    store,
                    call,
                    tenant=T,
                    key=key,
                    action_type="payments.refund",
                    params={"charge_id": "ch_1", "amount_cents": 1, "currency": "EUR"},
                    timeout_s=5,
                )
            with pytest.raises(OperationConflictError):  # the step: same charge, other amount
                await refund(Ticket(ticket_id="T-1", charge_id="ch_1", amount_cents=1))
        assert provider.refund_count() == 1
    assert event_types(db_url, T, key) == ["requested", "started", "succeeded"]


async def test_same_key_under_another_tenant_is_another_operation(db_url: str) -> None:
    store = ActionStore()
    with PaymentProvider() as provider:
        results = {}
        async with sessions_for(db_url) as sessions:
            for tenant in ("acme", "globex"):
                payments = PaymentsClient(provider.url, account=tenant)

                async def refund(key: str, payments=payments):
                    return await payments.refund(
                        key, charge_id="ch_1", amount_cents=5, currency="EUR"
                    )

                outcome = await run_action(
                    sessions,
                    store,
                    refund,
                    tenant=tenant,
                    key="shared-key",
                    action_type="refund",
                    params={"charge": "ch_1"},
                    timeout_s=10,
                )
                assert outcome.executed
                results[tenant] = outcome.result
            globex_view = await in_tx(sessions, lambda s: store.get(s, "globex", "shared-key"))
        assert provider.refund_count("acme") == 1 and provider.refund_count("globex") == 1
    assert results["acme"]["account"] == "acme" and results["globex"]["account"] == "globex"
    assert globex_view.result == results["globex"] != results["acme"]
    assert event_types(db_url, "globex", "shared-key") == ["requested", "started", "succeeded"]


async def test_transient_failures_retry_with_backoff_until_the_attempts_run_out(
    db_url: str,
) -> None:
    store = ActionStore()
    calls: list[str] = []

    async def flaky(key: str):
        calls.append(key)
        if len(calls) < 3:
            raise TransientError("503 from provider")
        return {"ok": len(calls)}

    async def down(key: str):
        calls.append(key)
        raise TransientError("connection refused")

    async with sessions_for(db_url) as sessions:
        request = {
            "tenant": T,
            "action_type": "refund",
            "params": {},
            "timeout_s": 5,
            "retry": FAST,
        }
        outcome = await run_action(sessions, store, flaky, key="flaky", **request)
        assert outcome.result == {"ok": 3} and outcome.operation.attempts == 3

        calls.clear()
        with pytest.raises(ActionFailedError, match="gave up after 3 attempts"):
            await run_action(sessions, store, down, key="down", **request)
        with pytest.raises(ActionFailedError):  # the failure is returned, nothing is called
            await run_action(sessions, store, down, key="down", **request)
        assert len(calls) == 3
    assert event_types(db_url, T, "flaky") == [
        "requested",
        "started",
        "failed",
        "started",
        "failed",
        "started",
        "succeeded",
    ]
    assert event_types(db_url, T, "down")[-1] == "failed"


async def test_transient_retries_stop_when_the_elapsed_budget_is_spent(db_url: str) -> None:
    """The budget runs from the operation's first claim (database clock), not per call: two
    slow calls of 0.4 s spend a 0.7 s budget although eight attempts are left."""
    store = ActionStore()
    calls: list[str] = []

    async def slow_and_refused(key: str):
        calls.append(key)
        await asyncio.sleep(0.4)
        raise TransientError("503 after a slow answer")

    budget = RetryPolicy(
        max_attempts=10, backoff=Backoff(base_s=0.01, cap_s=0.02), max_elapsed_s=0.7
    )
    async with sessions_for(db_url) as sessions:
        with pytest.raises(ActionFailedError, match="gave up after 2 attempts") as raised:
            await run_action(
                sessions,
                store,
                slow_and_refused,
                tenant=T,
                key="slow",
                action_type="refund",
                params={},
                timeout_s=5,
                retry=budget,
            )
    assert len(calls) == 2
    assert raised.value.record.state is State.FAILED_FINAL and raised.value.record.attempts == 2
    assert event_types(db_url, T, "slow")[-1] == "failed"


async def test_permanent_failure_is_final_and_returned_later(db_url: str) -> None:
    store = ActionStore()
    with PaymentProvider() as provider:
        payments = PaymentsClient(provider.url, account=T)

        async def bad_refund(key: str):
            return await payments.refund(key, charge_id="ch_1", amount_cents=0, currency="EUR")

        async with sessions_for(db_url) as sessions:
            request = {"tenant": T, "key": "bad", "action_type": "refund", "params": {}}
            with pytest.raises(ActionFailedError, match="400"):
                await run_action(sessions, store, bad_refund, timeout_s=5, **request)
            with pytest.raises(ActionFailedError, match="400") as raised:
                await run_action(sessions, store, bad_refund, timeout_s=5, **request)
            assert raised.value.record.attempts == 1
        assert provider.refund_count() == 0
    assert event_types(db_url, T, "bad") == ["requested", "started", "failed"]


async def test_wrong_manual_retry_is_absorbed_by_the_providers_idempotency(db_url: str) -> None:
    store = ActionStore()
    with PaymentProvider() as provider:
        async with sessions_for(db_url) as sessions:
            refund = refunds_for(sessions, store, provider)
            key = refund.key(TICKET)
            provider.inject(Fault.DROP_AFTER_COMMIT)
            with pytest.raises(ActionOutcomeUnknownError):
                await refund(TICKET)
            await in_tx(
                sessions,
                lambda s: store.resolve(
                    s,
                    tenant=T,
                    key=key,
                    resolution=Resolution.RETRY,
                    by="bob",
                    reason="assumed it failed",
                ),
            )
            again = await refund(TICKET)  # executes: same Idempotency-Key
        assert again.executed and again.value == provider_refund(provider)
        assert provider.refund_count() == 1 and provider.replays == 1
    assert event_types(db_url, T, key)[-3:] == ["reconciled", "started", "succeeded"]


async def test_after_expiry_the_same_key_runs_again_as_a_new_operation(db_url: str) -> None:
    store = ActionStore(ttl_s=0.001)
    with PaymentProvider() as provider:
        async with sessions_for(db_url) as sessions:
            refund = refunds_for(sessions, store, provider)
            key = refund.key(TICKET)
            first = await refund(TICKET)

            async def db_now() -> int:
                async with sessions() as session:
                    dialect = session.get_bind().dialect.name
                    return await session.scalar(select(db_now_ms(dialect)))

            await wait_for(db_now, lambda now: now > first.operation.expires_ms, 10, "expiry")
            second = await refund(TICKET)
        assert second.executed and second.operation.generation == 2
        # a new generation is a new action: a new Idempotency-Key, a new refund, no replay
        assert provider.refund_count() == 2 and provider.replays == 0
        keys = [refund["idempotency_key"] for refund in provider.refunds()]
        assert keys == [f"{key}:g1", f"{key}:g2"]
        assert second.value == provider_refund(provider, 1) != first.value
    assert event_types(db_url, T, key) == ["requested", "started", "succeeded"] * 2


async def test_a_cancelled_call_is_recorded_as_unknown(db_url: str) -> None:
    store = ActionStore()
    with PaymentProvider() as provider:
        hold = provider.inject(Fault.HOLD_AFTER_COMMIT)
        async with sessions_for(db_url) as sessions:
            refund = refunds_for(sessions, store, provider)
            key = refund.key(TICKET)
            task = asyncio.create_task(refund(TICKET))
            await wait_for(hold.reached.is_set, bool, 10, "the refund to be committed")
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            hold.release()
            op = await in_tx(sessions, lambda s: store.get(s, T, key))
        assert op.state is State.UNKNOWN and op.last_error.startswith("cancelled")
        assert provider.refund_count() == 1
