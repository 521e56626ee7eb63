"""Versioning: stored histories of v1 replay against the code, and old runs keep their version.

The fixtures in ``histories/`` were recorded by running real instances of the test workflow
through the engine (``python -m tests.workflows.record_histories``). They are replayed against
the v1 definition as the code has it now: any handler edit that would decide otherwise for a
running v1 instance is a mismatch, caught here rather than in production.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from outboxkit.actions import ActionStore, State
from outboxkit.workflows import Goto, Next, Wait, Workflow, WorkflowContext
from outboxkit.workflows.replay import ReplayReport, history_from_json, replay

from examples.refund_agent.provider import PaymentProvider
from tests.support import workflows as wf
from tests.support.actions import in_tx
from tests.workflows.record_histories import HERE, record

FIXTURES = sorted(HERE.glob("refund-v1-*.json"))


def load(path: Path) -> dict[str, Any]:
    """A fixture, with its history as records."""
    fixture = json.loads(path.read_text())
    fixture["records"] = history_from_json(fixture["history"])
    return fixture


async def replay_fixture(definition: Workflow, fixture: dict[str, Any]) -> ReplayReport:
    return await replay(
        definition,
        fixture["records"],
        tenant=fixture["tenant"],
        workflow_id=fixture["workflow_id"],
    )


def test_the_fixtures_cover_every_replayed_kind() -> None:
    kinds = {r.kind for path in FIXTURES for r in load(path)["records"]}
    assert len(FIXTURES) == 3
    assert {"transition", "wait", "resume", "complete", "approval_stale"} <= kinds


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
async def test_stored_v1_histories_replay_against_the_current_v1(path: Path) -> None:
    fixture = load(path)
    report = await replay_fixture(wf.build(1), fixture)
    assert report.ok, str(report)
    handled = [r for r in fixture["records"] if r.seq in report.replayed]
    assert {r.kind for r in handled} >= {"transition", "wait", "resume"}
    # every record where a handler ran was replayed; the engine's own were not
    skipped = [r.kind for r in fixture["records"] if r.seq in report.skipped]
    assert not set(skipped) & {"transition", "wait", "resume", "complete"}


async def test_a_fresh_recording_replays_too(sqlite_url: str) -> None:
    """What the engine writes today replays (the fixtures are not a frozen format only)."""
    with PaymentProvider() as provider:
        fresh = await record(sqlite_url, provider.url)
    for fixture in fresh.values():
        fixture["records"] = history_from_json(fixture["history"])
        report = await replay_fixture(wf.build(1), fixture)
        assert report.ok, str(report)


def edited(change: str) -> Workflow:
    """v1 with one handler edited incompatibly (what a careless deploy would ship)."""
    definition = wf.build(1)
    states = definition.states

    def replace(state: str, handler: Any, **kwargs: Any) -> None:
        states[state] = dataclasses.replace(states[state], handler=handler, **kwargs)

    original_intake = states["intake"].handler
    original_wait = states["await_approval"].handler

    if change == "effect key":  # the refund under another key: a second refund in production

        async def execute(ctx: WorkflowContext) -> Next:
            version = await ctx.observe("record_version", _never)
            ctx.require_approval(wf.approval_request(ctx.input, version))
            params = {k: ctx.input[k] for k in ("charge_id", "amount_cents", "currency")}
            key = f"{ctx.workflow_id}:refund:v1-retry"
            await ctx.effect("payments.refund", key=key, params=params, run=_never_run)
            return Goto("notify")

        replace("execute", execute)
    elif change == "next state":  # intake skips the approval

        async def intake(ctx: WorkflowContext) -> Next:
            await ctx.observe("record_version", _never)
            return Goto("execute")

        replace("intake", intake)
    elif change == "wait mapping":  # a rejection now leads to human_review

        async def await_approval(ctx: WorkflowContext) -> Next:
            step = await original_wait(ctx)
            assert isinstance(step, Wait)
            on = {**step.on, "approval.rejected": "human_review"}
            return dataclasses.replace(step, on=on)

        replace("await_approval", await_approval)
    elif change == "data":  # the handler stores something else

        async def intake_data(ctx: WorkflowContext) -> Next:
            step = await original_intake(ctx)
            ctx.data["record_version"] = str(ctx.data["record_version"])
            return step

        replace("intake", intake_data)
    elif change == "recheck":  # a new re-check on resume

        async def always_fails(ctx: WorkflowContext) -> str | None:
            return "rejected"

        states["await_approval"] = dataclasses.replace(
            states["await_approval"], rechecks=(always_fails,)
        )
    return definition


async def _never() -> Any:
    raise AssertionError("replay never reads the outside world")


async def _never_run(idempotency_key: str) -> Any:
    raise AssertionError("replay never runs an effect")


@pytest.mark.parametrize(
    ("change", "what"),
    [
        ("effect key", "error"),
        ("next state", "target"),
        ("wait mapping", "wait"),
        ("data", "data"),
        ("recheck", "target"),
    ],
)
async def test_an_incompatible_edit_of_v1_is_caught(change: str, what: str) -> None:
    fixture = load(HERE / "refund-v1-complete.json")
    report = await replay_fixture(edited(change), fixture)
    assert not report.ok
    assert what in {m.what for m in report.mismatches}, str(report)
    if change == "effect key":
        [mismatch] = report.mismatches
        assert "NondeterminismError" in mismatch.replayed and "R-100:refund:v1-retry" in str(
            mismatch
        )


async def test_deploy_a_new_version_while_old_runs_are_active(db_url: str) -> None:
    """A v1 instance started before the deploy finishes on v1's handlers; new starts use v2."""
    wf.reset_world()
    store = ActionStore()
    with PaymentProvider() as provider:
        async with wf.engine_on(db_url, [wf.build(1)]) as before:
            await wf.start(before, "R-old", wf.refund_input(provider.url, "ch_old"))
            await wf.until_state(before, "R-old", {"await_approval"})
        # the deploy: a new engine knows v1 and v2
        async with wf.engine_on(db_url, [wf.build(1), wf.build(2)]) as after:
            await wf.approve(after, "R-old")
            await wf.start(after, "R-new", wf.refund_input(provider.url, "ch_new"))
            await wf.approve(after, "R-new")
            old = await wf.until_state(after, "R-old", {"complete"})
            new = await wf.until_state(after, "R-new", {"complete"})
            assert (old.version, new.version) == (1, 2)
            assert "flow" not in old.data and new.data["flow"] == "v2"
            for workflow_id, version in (("R-old", 1), ("R-new", 2)):
                key = f"{workflow_id}:refund:v{version}"
                op = await in_tx(after.sessions, lambda s, k=key: store.get(s, wf.TENANT, k))
                assert op is not None and op.state is State.SUCCEEDED
                records = await wf.history(after, workflow_id)
                assert {r.version for r in records} == {version}
                assert any(step["key"] == key for r in records for step in r.steps)
        keys = sorted(r["idempotency_key"] for r in provider.refunds())
        assert keys == ["R-new:refund:v2:g1", "R-old:refund:v1:g1"]
