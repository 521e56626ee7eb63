"""The operation state machine, on SQLite and PostgreSQL, through ActionStore directly."""

from __future__ import annotations

import pytest
from outboxkit.actions import (
    Absent,
    ActionRequested,
    ActionStarted,
    ActionStore,
    ActionSucceeded,
    DecisionKind,
    Found,
    IllegalTransitionError,
    OperationConflictError,
    OperationNotFoundError,
    Resolution,
    StaleLeaseError,
    State,
    Unclear,
)
from outboxkit.actions.cleanup import purge_audit, purge_expired
from outboxkit.actions.events import EVENT_MODELS
from outboxkit.outbox.clock import db_now_ms
from sqlalchemy import select

from tests.support.actions import (
    audit_of,
    begin,
    count_operations,
    event_types,
    events_of,
    in_tx,
    sessions_for,
)
from tests.support.kafka import wait_for

T = "acme"
PARAMS = {"charge_id": "ch_1", "amount_cents": 500, "currency": "EUR"}


def req(key: str = "op-1", params: dict | None = None, **kwargs) -> dict:
    return {
        "tenant": T,
        "key": key,
        "action_type": "payments.refund",
        "params": PARAMS if params is None else params,
        **kwargs,
    }


async def db_time_after(sessions, ms: int) -> None:
    """Wait (with a deadline) until the database clock is past ``ms``."""

    async def now() -> int:
        async with sessions() as session:
            return await session.scalar(select(db_now_ms(session.get_bind().dialect.name)))

    await wait_for(now, lambda value: value > ms, timeout=10, what=f"db clock past {ms}")


async def test_new_key_is_claimed_once_and_a_retry_gets_the_stored_result(db_url: str) -> None:
    store = ActionStore()
    async with sessions_for(db_url) as sessions:
        first = await begin(sessions, store, **req())
        assert first.kind is DecisionKind.EXECUTE and first.should_execute
        assert first.operation.state is State.RUNNING and first.operation.attempts == 1
        assert (await begin(sessions, store, **req())).kind is DecisionKind.IN_PROGRESS

        done = await in_tx(
            sessions,
            lambda s: store.complete(s, first.lease, result={"id": "re_1"}, external_ref="re_1"),
        )
        assert done.state is State.SUCCEEDED
        again = await in_tx(
            sessions, lambda s: store.complete(s, first.lease, result={"id": "other"})
        )  # a repeated complete (lost DB reply) changes nothing
        assert again.result == {"id": "re_1"}

        retry = await begin(sessions, store, **req())
        assert retry.kind is DecisionKind.SUCCEEDED and not retry.should_execute
        assert retry.operation.result == {"id": "re_1"}
        assert retry.operation.external_ref == "re_1"
    assert event_types(db_url, T, "op-1") == ["requested", "started", "succeeded"]
    assert audit_of(db_url, T, "op-1") == [
        (None, "PENDING"),
        ("PENDING", "RUNNING"),
        ("RUNNING", "SUCCEEDED"),
    ]
    events = events_of(db_url, T, "op-1")
    assert [e.event_id for e in events] == [
        "acme/op-1/g1/a0/NEW>PENDING",
        "acme/op-1/g1/a1/PENDING>RUNNING",
        "acme/op-1/g1/a1/RUNNING>SUCCEEDED",
    ]
    assert {e.key for e in events} == {b"op-1"}  # partitionkey = operation key
    assert all("result" not in e.data for e in events)
    # every key is always there (the schema holds steady), and each event parses as its model
    assert [e.data["external_ref"] for e in events] == [None, None, "re_1"]
    parsed = [EVENT_MODELS[e.type].model_validate(e.data) for e in events]
    assert [type(p) for p in parsed] == [ActionRequested, ActionStarted, ActionSucceeded]
    assert parsed[2].from_state is State.RUNNING and parsed[2].external_ref == "re_1"
    assert parsed[0].model_dump(mode="json", by_alias=True) == events[0].data


async def test_a_rolled_back_begin_leaves_neither_record_nor_event(db_url: str) -> None:
    store = ActionStore()
    async with sessions_for(db_url) as sessions, sessions() as session:
        await session.begin()
        assert (await store.begin(session, **req())).should_execute
        await session.rollback()
    assert count_operations(db_url) == 0
    assert events_of(db_url, T, "op-1") == []


async def test_same_key_with_other_parameters_is_a_conflict_never_the_old_result(
    db_url: str,
) -> None:
    store = ActionStore()
    async with sessions_for(db_url) as sessions:
        first = await begin(sessions, store, **req())
        with pytest.raises(OperationConflictError):  # while running
            await begin(sessions, store, **req(params={**PARAMS, "amount_cents": 501}))
        await in_tx(sessions, lambda s: store.complete(s, first.lease, result={"secret": "re_1"}))
        with pytest.raises(OperationConflictError) as raised:
            await begin(sessions, store, **req(params={**PARAMS, "amount_cents": 501}))
        assert "re_1" not in str(raised.value) and not hasattr(raised.value, "record")
        with pytest.raises(OperationConflictError):
            await begin(sessions, store, **{**req(), "action_type": "payments.charge"})
    assert event_types(db_url, T, "op-1") == ["requested", "started", "succeeded"]


async def test_transient_failure_goes_back_to_pending_with_the_attempt_counted(
    db_url: str,
) -> None:
    store = ActionStore()
    async with sessions_for(db_url) as sessions:
        first = await begin(sessions, store, **req())
        pending = await in_tx(sessions, lambda s: store.fail(s, first.lease, "503", final=False))
        assert (pending.state, pending.attempts, pending.last_error) == (State.PENDING, 1, "503")

        second = await begin(sessions, store, **req())
        assert second.kind is DecisionKind.EXECUTE and second.lease.attempt == 2
        with pytest.raises(StaleLeaseError):  # the first attempt no longer owns it
            await in_tx(sessions, lambda s: store.complete(s, first.lease, result=1))
        await in_tx(sessions, lambda s: store.fail(s, second.lease, "card closed", final=True))

        final = await begin(sessions, store, **req())
        assert final.kind is DecisionKind.FAILED
        assert final.operation.last_error == "card closed"
    assert event_types(db_url, T, "op-1") == [
        "requested",
        "started",
        "failed",
        "started",
        "failed",
    ]


async def test_unknown_is_never_retried_until_reconciled(db_url: str) -> None:
    store = ActionStore()
    async with sessions_for(db_url) as sessions:
        first = await begin(sessions, store, **req())
        await in_tx(sessions, lambda s: store.mark_unknown(s, first.lease, "timed out"))
        blocked = await begin(sessions, store, **req())
        assert blocked.kind is DecisionKind.UNKNOWN and blocked.lease is None

        unclear = Unclear("provider lookup timed out")
        for _ in range(2):  # flagged once, not once per reconcile pass
            flagged = await in_tx(
                sessions, lambda s: store.reconcile(s, blocked.operation, unclear)
            )
            assert flagged.state is State.UNKNOWN and flagged.needs_attention
        assert (await begin(sessions, store, **req())).kind is DecisionKind.UNKNOWN

        retryable = await in_tx(sessions, lambda s: store.reconcile(s, flagged, Absent()))
        assert retryable.state is State.PENDING and not retryable.needs_attention
        second = await begin(sessions, store, **req())
        assert second.kind is DecisionKind.EXECUTE and second.lease.attempt == 2
    assert event_types(db_url, T, "op-1") == [
        "requested",
        "started",
        "unknown",
        "flagged",
        "reconciled",
        "started",
    ]


async def test_reconcile_found_stores_the_external_result(db_url: str) -> None:
    store = ActionStore()
    async with sessions_for(db_url) as sessions:
        first = await begin(sessions, store, **req())
        unknown = await in_tx(sessions, lambda s: store.mark_unknown(s, first.lease, "timeout"))
        found = Found(result={"id": "re_9"}, external_ref="re_9")
        done = await in_tx(sessions, lambda s: store.reconcile(s, unknown, found, actor="nightly"))
        assert done.state is State.SUCCEEDED and done.result == {"id": "re_9"}
        # a second reconciler pass with an old snapshot changes nothing
        same = await in_tx(sessions, lambda s: store.reconcile(s, unknown, Absent()))
        assert same.state is State.SUCCEEDED
        assert (await begin(sessions, store, **req())).operation.result == {"id": "re_9"}
        trail = await in_tx(sessions, lambda s: store.history(s, T, "op-1"))
    assert trail[-1].actor == "nightly" and trail[-1].detail == {"outcome": "found"}


async def test_expired_lease_makes_the_operation_unknown_not_pending(db_url: str) -> None:
    store = ActionStore()
    async with sessions_for(db_url) as sessions:
        crashed = await begin(sessions, store, **req(lease_s=0.001))
        # detection inside begin: no second execution, the outcome is unknown
        decision = await wait_for(
            lambda: begin(sessions, store, **req()),
            lambda d: d.kind is not DecisionKind.IN_PROGRESS,
            timeout=10,
            what="lease expiry detected by begin",
        )
        assert decision.kind is DecisionKind.UNKNOWN
        # the worker that held it still learns its outcome: accepted, late
        late = await in_tx(sessions, lambda s: store.complete(s, crashed.lease, result={"ok": 1}))
        assert late.state is State.SUCCEEDED

        other = await begin(sessions, store, **req(key="op-2", lease_s=0.001))
        swept = await wait_for(
            lambda: in_tx(sessions, lambda s: store.sweep_expired_leases(s)),
            lambda found: len(found) == 1,
            timeout=10,
            what="the sweep to find the expired lease",
        )
        assert swept[0].key == "op-2" and swept[0].state is State.UNKNOWN
        assert other.lease is not None
    assert event_types(db_url, T, "op-1") == ["requested", "started", "unknown", "succeeded"]
    assert event_types(db_url, T, "op-2") == ["requested", "started", "unknown"]


async def test_operator_resolution_is_audited_and_checked(db_url: str) -> None:
    store = ActionStore()
    async with sessions_for(db_url) as sessions:
        running = await begin(sessions, store, **req())
        resolve = {"tenant": T, "key": "op-1", "by": "alice", "reason": "checked the bank"}
        with pytest.raises(IllegalTransitionError, match="live lease"):
            await in_tx(
                sessions, lambda s: store.resolve(s, resolution=Resolution.RETRY, **resolve)
            )
        await in_tx(sessions, lambda s: store.mark_unknown(s, running.lease, "timeout"))
        done = await in_tx(
            sessions,
            lambda s: store.resolve(
                s, resolution=Resolution.SUCCEEDED, result={"id": "re_7"}, **resolve
            ),
        )
        assert done.state is State.SUCCEEDED and done.result == {"id": "re_7"}
        with pytest.raises(IllegalTransitionError):
            await in_tx(
                sessions, lambda s: store.resolve(s, resolution=Resolution.RETRY, **resolve)
            )
        with pytest.raises(OperationNotFoundError):
            await in_tx(
                sessions,
                lambda s: store.resolve(
                    s, resolution=Resolution.FAILED, **{**resolve, "key": "missing"}
                ),
            )
        trail = await in_tx(sessions, lambda s: store.history(s, T, "op-1"))
    last = trail[-1]
    assert (last.from_state, last.to_state, last.actor) == ("UNKNOWN", "SUCCEEDED", "alice")
    assert "checked the bank" in last.reason and last.detail["outcome"] == "manual"
    assert event_types(db_url, T, "op-1")[-1] == "reconciled"


async def test_after_expiry_a_begin_starts_a_new_generation_audited(db_url: str) -> None:
    store = ActionStore(ttl_s=0.001)
    async with sessions_for(db_url) as sessions:
        first = await begin(sessions, store, **req())
        done = await in_tx(sessions, lambda s: store.complete(s, first.lease, result={"n": 1}))
        await db_time_after(sessions, done.expires_ms)

        fresh = await begin(sessions, store, **req(params={**PARAMS, "amount_cents": 9}))
        assert fresh.kind is DecisionKind.EXECUTE
        assert (fresh.operation.generation, fresh.operation.attempts) == (2, 1)
        assert fresh.operation.result is None
        trail = await in_tx(sessions, lambda s: store.history(s, T, "op-1"))
    replaced = trail[3]
    assert (replaced.from_state, replaced.to_state, replaced.generation) == (
        "SUCCEEDED",
        "PENDING",
        2,
    )
    assert replaced.detail["replaced"]["result"] == {"n": 1}  # the old record, archived
    ids = [e.event_id for e in events_of(db_url, T, "op-1")]
    assert ids[-2:] == ["acme/op-1/g2/a0/SUCCEEDED>PENDING", "acme/op-1/g2/a1/PENDING>RUNNING"]


async def test_unknown_and_running_records_never_expire(db_url: str) -> None:
    store = ActionStore(ttl_s=0.001)
    async with sessions_for(db_url) as sessions:
        first = await begin(sessions, store, **req())
        unknown = await in_tx(sessions, lambda s: store.mark_unknown(s, first.lease, "timeout"))
        await db_time_after(sessions, unknown.expires_ms)
        decision = await begin(sessions, store, **req())
        assert decision.kind is DecisionKind.UNKNOWN  # not replaced by a new operation
        with pytest.raises(OperationConflictError):
            await begin(sessions, store, **req(params={"other": True}))
        assert await purge_expired(sessions) == 0
    assert count_operations(db_url) == 1


async def test_cleanup_deletes_expired_records_in_chunks_and_keeps_the_audit(
    db_url: str,
) -> None:
    store = ActionStore(ttl_s=0.001)
    async with sessions_for(db_url) as sessions:
        last = None
        for n in range(7):
            started = await begin(sessions, store, **req(key=f"op-{n}"))
            last = await in_tx(sessions, lambda s, lease=started.lease: store.complete(s, lease))
        await db_time_after(sessions, last.expires_ms)
        assert await purge_expired(sessions, chunk_size=3, max_chunks=1) == 3
        assert await purge_expired(sessions, chunk_size=3) == 4
        assert await in_tx(sessions, lambda s: store.get(s, T, "op-0")) is None
        trail = await in_tx(sessions, lambda s: store.history(s, T, "op-0"))
        assert len(trail) == 3
        assert await purge_audit(sessions, older_than_s=0, chunk_size=5) == 21
    assert count_operations(db_url) == 0


async def test_tenants_never_see_each_others_operations(db_url: str) -> None:
    store = ActionStore()
    async with sessions_for(db_url) as sessions:
        a = await begin(sessions, store, **req())
        b = await begin(sessions, store, **{**req(), "tenant": "globex"})
        assert a.should_execute and b.should_execute  # same key, another tenant: another op
        await in_tx(sessions, lambda s: store.complete(s, a.lease, result={"tenant": "acme"}))
        seen_by_b = await in_tx(sessions, lambda s: store.get(s, "globex", "op-1"))
        assert seen_by_b.state is State.RUNNING and seen_by_b.result is None
        with pytest.raises(StaleLeaseError):  # a lease of one tenant cannot finish the other's
            await in_tx(
                sessions,
                lambda s: store.complete(
                    s, type(a.lease)("globex", "op-1", 1, 1, a.lease.holder), result={}
                ),
            )
        assert await in_tx(sessions, lambda s: store.get(s, "initech", "op-1")) is None
    assert event_types(db_url, "globex", "op-1") == ["requested", "started"]
