"""Real concurrency on PostgreSQL: separate connections, asyncio tasks and OS threads."""

from __future__ import annotations

import asyncio
import threading

from outboxkit.actions import ActionStore, DecisionKind, State
from outboxkit.outbox.backoff import Backoff

from examples.refund_agent.agent import Ticket
from examples.refund_agent.provider import Fault, PaymentProvider
from tests.support.actions import RefundSteps, audit_of, begin, event_types, in_tx, sessions_for
from tests.support.kafka import wait_for
from tests.support.waits import scaled

T = "acme"
REQUEST = {"tenant": T, "key": "op-1", "action_type": "refund", "params": {"amount": 5}}


async def test_two_concurrent_requests_with_one_key_make_one_refund(pg_url: str) -> None:
    store = ActionStore()
    ticket = Ticket(ticket_id="T-1", charge_id="ch_1", amount_cents=1999)
    poll = Backoff(base_s=0.02, cap_s=0.1, floor_s=0.02)
    begins = 0

    with PaymentProvider() as provider:
        hold = provider.inject(Fault.HOLD_AFTER_COMMIT)
        async with sessions_for(pg_url) as sessions_a, sessions_for(pg_url) as sessions_b:

            def counted(sessions):
                def open_session():
                    nonlocal begins
                    begins += 1
                    return sessions()

                return open_session

            agents = [
                RefundSteps(counted(sessions), store, provider.url, tenant=T, poll_backoff=poll)
                for sessions in (sessions_a, sessions_b)
            ]
            key = agents[0].key(ticket)
            tasks = [asyncio.create_task(refund(ticket)) for refund in agents]
            await wait_for(hold.reached.is_set, bool, 30, "one refund to reach the provider")
            # while the winner is held after the refund, the loser keeps polling
            await wait_for(lambda: begins, lambda n: n >= 4, 30, "the other request to poll")
            probe = await begin(
                sessions_a,
                store,
                tenant=T,
                key=key,
                action_type="payments.refund",
                params={"charge_id": "ch_1", "amount_cents": 1999, "currency": "EUR"},
            )
            assert probe.kind is DecisionKind.IN_PROGRESS
            hold.release()
            outcomes = await asyncio.wait_for(asyncio.gather(*tasks), scaled(30))
        assert provider.refund_count() == 1
        assert provider.in_flight_rejections == 0 and provider.replays == 0
    assert sorted(o.executed for o in outcomes) == [False, True]
    assert outcomes[0].value == outcomes[1].value
    assert outcomes[0].value.id == provider.refunds()[0]["id"]
    assert event_types(pg_url, T, key) == ["requested", "started", "succeeded"]


async def test_many_concurrent_begins_of_a_new_key_claim_it_once(pg_url: str) -> None:
    store = ActionStore()
    contenders = 8
    async with sessions_for(pg_url, pool_size=contenders) as sessions:
        barrier = asyncio.Barrier(contenders)

        async def contend():
            async with sessions() as session, session.begin():
                await session.connection()  # each contender holds its own connection
                await barrier.wait()
                return await store.begin(session, **REQUEST)

        decisions = await asyncio.wait_for(
            asyncio.gather(*(contend() for _ in range(contenders))), 30
        )
    kinds = sorted(d.kind for d in decisions)
    assert kinds.count(DecisionKind.EXECUTE) == 1
    assert kinds.count(DecisionKind.IN_PROGRESS) == contenders - 1
    assert audit_of(pg_url, T, "op-1") == [(None, "PENDING"), ("PENDING", "RUNNING")]
    assert event_types(pg_url, T, "op-1") == ["requested", "started"]


async def test_threads_racing_to_reclaim_a_pending_operation_claim_it_once(pg_url: str) -> None:
    store = ActionStore()
    async with sessions_for(pg_url) as sessions:
        first = await begin(sessions, store, **REQUEST)
        await in_tx(sessions, lambda s: store.fail(s, first.lease, "503", final=False))

    threads = 6
    barrier = threading.Barrier(threads)
    decisions: list = []
    errors: list[BaseException] = []

    def contend() -> None:
        async def attempt():
            async with (
                sessions_for(pg_url, pool_size=1) as own,
                own() as session,
                session.begin(),
            ):
                await session.connection()
                await asyncio.to_thread(barrier.wait, 30)
                return await store.begin(session, **REQUEST)

        try:
            decisions.append(asyncio.run(attempt()))
        except BaseException as error:
            errors.append(error)

    workers = [threading.Thread(target=contend) for _ in range(threads)]
    for worker in workers:
        worker.start()
    await asyncio.to_thread(lambda: [worker.join(60) for worker in workers])
    assert not errors and len(decisions) == threads
    executed = [d for d in decisions if d.kind is DecisionKind.EXECUTE]
    assert len(executed) == 1 and executed[0].lease.attempt == 2
    assert all(d.kind is DecisionKind.IN_PROGRESS for d in decisions if d not in executed)
    assert event_types(pg_url, T, "op-1") == ["requested", "started", "failed", "started"]


async def test_completion_racing_a_lease_sweep_ends_consistent(pg_url: str) -> None:
    store = ActionStore()
    async with sessions_for(pg_url, pool_size=4) as sessions:
        for n in range(10):
            request = {**REQUEST, "key": f"op-{n}", "lease_s": 0.001}
            claimed = await begin(sessions, store, **request)
            results = await asyncio.gather(
                in_tx(
                    sessions,
                    lambda s, lease=claimed.lease, n=n: store.complete(s, lease, result=n),
                ),
                in_tx(sessions, lambda s: store.sweep_expired_leases(s)),
                return_exceptions=True,
            )
            assert not any(isinstance(r, BaseException) for r in results), results
            final = await in_tx(sessions, lambda s, key=f"op-{n}": store.get(s, T, key))
            # the worker's answer wins either way: directly, or late after the sweep
            assert final.state is State.SUCCEEDED and final.result == n
            assert event_types(pg_url, T, f"op-{n}")[-1] == "succeeded"
