"""The step API: typed arguments and results, keys from the run context, heartbeats, waiting.

Refunds go to the example's payment provider over real HTTP and are counted there.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from outboxkit.actions import (
    ActionOutcomeUnknownError,
    Actions,
    ActionStore,
    InvalidActionInputError,
    State,
    StepContextError,
    current_step,
    operation_key,
    reconcile_unknown,
    step,
)
from outboxkit.outbox.backoff import Backoff

from examples.refund_agent.agent import Refund, Ticket, refund_step
from examples.refund_agent.payments import PaymentsClient
from examples.refund_agent.provider import Fault, PaymentProvider
from tests.support.actions import RefundSteps, event_types, in_tx, sessions_for
from tests.support.kafka import wait_for
from tests.support.waits import scaled

T = "acme"
TICKET = Ticket(ticket_id="T-1", charge_id="ch_1", amount_cents=1999)


async def test_a_step_returns_the_same_typed_result_first_and_on_replay(db_url: str) -> None:
    with PaymentProvider() as provider:
        async with sessions_for(db_url) as sessions:
            refund = refund_step(PaymentsClient(provider.url, account=T))
            with Actions(sessions, tenant=T, run_id="run-1"):
                first = await refund("ch_1", 1999)
                replay = await refund("ch_1", 1999, "EUR")  # the default, spelled out
                outcome = await refund.outcome(charge_id="ch_1", amount_cents=1999)
                key = refund.key("ch_1", 1999)
            op = await in_tx(sessions, lambda s: ActionStore().get(s, T, key))
        assert isinstance(first, Refund) and first == replay == outcome.value
        assert first == Refund.model_validate(provider.refunds()[0])
        assert not outcome.executed and provider.refund_count() == 1
    # the key is documented: tenant, run id, step (= action type), target (canonical JSON), 1
    assert key == operation_key(T, "run-1", "payments.refund", "payments.refund", '["ch_1"]', 1)
    assert op.external_ref == first.id and op.state is State.SUCCEEDED
    assert event_types(db_url, T, key) == ["requested", "started", "succeeded"]


async def test_arguments_are_validated_and_what_is_hashed_is_what_is_sent(
    sqlite_url: str,
) -> None:
    with PaymentProvider() as provider:
        async with sessions_for(sqlite_url) as sessions:
            refund = refund_step(PaymentsClient(provider.url, account=T))
            with Actions(sessions, tenant=T, run_id="run-1"):
                # "1999" is validated into 1999 before hashing, and 1999 is what is sent
                assert refund.key("ch_1", "1999") == refund.key("ch_1", 1999)  # type: ignore[arg-type]
                made = await refund("ch_1", "1999")  # type: ignore[arg-type]
                with pytest.raises(InvalidActionInputError, match="amount_cents"):
                    await refund("ch_1", 50_001)  # over the annotated limit: never sent
                with pytest.raises(TypeError):
                    await refund("ch_1")  # type: ignore[call-arg]
        assert made.amount_cents == 1999 and provider.refund_count() == 1
        assert provider.refunds()[0]["amount_cents"] == 1999


async def test_without_a_target_other_arguments_are_another_operation(sqlite_url: str) -> None:
    sent: list[tuple[str, int]] = []

    @step("mail.send")
    async def send(to: str, template: int) -> dict[str, str]:
        sent.append((current_step().idempotency_key, template))
        return {"to": to}

    async with sessions_for(sqlite_url) as sessions:
        with Actions(sessions, tenant=T, run_id="run-1"):
            assert await send("a@example.com", 1) == {"to": "a@example.com"}
            await send("a@example.com", 2)
            await send("a@example.com", 1)  # the same call again: the stored result
        with Actions(sessions, tenant=T, run_id="run-2"):
            await send("a@example.com", 1)  # another run: another operation
    assert [template for _, template in sent] == [1, 2, 1]
    assert len({key for key, _ in sent}) == 3 and all(key.endswith(":g1") for key, _ in sent)


async def test_a_step_outside_a_run_context_is_refused() -> None:
    @step("mail.send")
    async def send(to: str) -> None:
        raise AssertionError("must not run")

    with pytest.raises(StepContextError):
        await send("a@example.com")
    with pytest.raises(StepContextError):
        current_step()
    with pytest.raises(TypeError, match="async"):
        step("mail.send")(lambda to: None)  # type: ignore[arg-type,return-value]


async def test_heartbeats_keep_a_step_running_longer_than_its_lease(db_url: str) -> None:
    """A lease of 1 s, a call held for 3 s: the operation stays RUNNING (no sweep takes it,
    another worker waits) and succeeds, with one refund. The lease leaves a heartbeat (every
    lease/3) two thirds of a second of slack, which a busy machine's SQLite writes need."""
    store = ActionStore()
    with PaymentProvider() as provider:
        hold = provider.inject(Fault.HOLD_AFTER_COMMIT)
        async with sessions_for(db_url) as sessions:
            refund = RefundSteps(sessions, store, provider.url, lease_s=1.0)
            key = refund.key(TICKET)
            task = asyncio.create_task(refund(TICKET))
            await wait_for(hold.reached.is_set, bool, 10, "the refund to be held")
            deadline = time.monotonic() + 3.0
            while time.monotonic() < deadline:  # three leases long
                assert await in_tx(sessions, store.sweep_expired_leases) == []
                op = await in_tx(sessions, lambda s: store.get(s, T, key))
                assert op.state is State.RUNNING
                await asyncio.sleep(0.1)
            hold.release()
            outcome = await asyncio.wait_for(task, scaled(30))
        assert outcome.executed and outcome.operation.state is State.SUCCEEDED
        assert provider.refund_count() == 1
    assert event_types(db_url, T, key) == ["requested", "started", "succeeded"]


@pytest.mark.parametrize("heartbeat_s", [0.6, 30.0])
async def test_a_step_whose_heartbeats_stop_ends_unknown(db_url: str, heartbeat_s: float) -> None:
    """Heartbeats slower than the lease: the lease expires under the running call. At 0.6 s a
    heartbeat finds it lost and cancels the call; at 30 s none comes, and the answer that
    arrives after expiry is not recorded as SUCCEEDED. Either way UNKNOWN, then reconciled."""
    store = ActionStore()
    with PaymentProvider() as provider:
        hold = provider.inject(Fault.HOLD_AFTER_COMMIT)
        async with sessions_for(db_url) as sessions:
            refund = RefundSteps(
                sessions, store, provider.url, lease_s=0.3, heartbeat_s=heartbeat_s
            )
            key = refund.key(TICKET)
            task = asyncio.create_task(refund(TICKET))
            await wait_for(hold.reached.is_set, bool, 10, "the refund to be held")
            if heartbeat_s < 1:
                with pytest.raises(ActionOutcomeUnknownError) as raised:
                    await asyncio.wait_for(task, scaled(10))  # cancelled by the lost heartbeat
                hold.release()
            else:
                await asyncio.sleep(0.6)  # two leases
                hold.release()
                with pytest.raises(ActionOutcomeUnknownError) as raised:
                    await asyncio.wait_for(task, scaled(10))
            assert raised.value.record.state is State.UNKNOWN
            assert "lease lost" in raised.value.record.last_error
            [done] = await reconcile_unknown(sessions, store, refund.payments.reconcile)
            assert done.state is State.SUCCEEDED
            assert (await refund(TICKET)).value.id == done.result["id"]
        assert provider.refund_count() == 1
    assert event_types(db_url, T, key) == ["requested", "started", "unknown", "reconciled"]


async def test_a_waiting_worker_wakes_on_the_change_not_on_its_next_poll(pg_url: str) -> None:
    """PostgreSQL: the second worker polls only every 5 s, yet returns within a fraction of a
    second of the first worker's commit, woken by LISTEN/NOTIFY."""
    store = ActionStore()
    slow_poll = Backoff(base_s=5.0, cap_s=5.0, floor_s=5.0)
    with PaymentProvider() as provider:
        hold = provider.inject(Fault.HOLD_AFTER_COMMIT)
        async with sessions_for(pg_url) as sessions:
            first = RefundSteps(sessions, store, provider.url)
            second = RefundSteps(sessions, store, provider.url, poll_backoff=slow_poll)
            running = asyncio.create_task(first(TICKET))
            await wait_for(hold.reached.is_set, bool, 10, "the first refund to be held")
            waiting = asyncio.create_task(second(TICKET))
            await asyncio.sleep(0.5)  # the second worker is waiting now
            assert not waiting.done()
            hold.release()
            done = await asyncio.wait_for(running, scaled(10))
            woken_at = time.monotonic()
            replayed = await asyncio.wait_for(waiting, scaled(10))
            latency_s = time.monotonic() - woken_at
        assert done.executed and not replayed.executed and replayed.value == done.value
        # A poll would take 5 s: the bound is sized for load, and stays under that.
        assert latency_s < min(scaled(1.0), 4.0), f"woken after {latency_s:.2f}s: polled"
        assert provider.refund_count() == 1 and provider.in_flight_rejections == 0
