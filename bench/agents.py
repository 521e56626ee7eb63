"""``python -m bench.agents [--calls 1000]``: the time outboxkit's pydantic-ai durability adds.

``--calls`` runs of a pydantic-ai agent (a ``FunctionModel`` answering at once, one no-op tool
call per run, then a text) go once bare and once as durable runs on PostgreSQL, interleaved in
rounds so drift in the machine's load hits both sides. For each durable tool call and model
request the time spent outside the wrapped call (the ledger: begin, claim, record, their
events) is measured; the per-run totals of both sides are compared too (a durable run also
records its start and its outcome).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

from outboxkit.actions.store import ActionStore
from outboxkit.agents import AgentRun
from outboxkit.agents.pydantic_ai import DurableAgent, DurableModel, DurableToolset
from outboxkit.outbox.db import make_async_engine
from outboxkit.outbox.driver import DriverSession
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlalchemy.ext.asyncio import async_sessionmaker

from bench.common import percentile, postgres_database, report

ROUNDS = 10


def build() -> tuple[Agent[None, str], FunctionModel]:
    async def lookup(order_id: str) -> dict[str, str]:
        """Look an order up (a no-op)."""
        return {"order_id": order_id, "status": "shipped"}

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if sum(isinstance(m, ModelResponse) for m in messages) == 0:
            return ModelResponse(parts=[ToolCallPart("lookup", {"order_id": "o-1"}, "c-0")])
        return ModelResponse(parts=[TextPart("shipped")])

    return Agent(name="bench", tools=[lookup]), FunctionModel(respond)


class RoundTrips:
    """Counts the database round trips of an engine: each statement, BEGIN and COMMIT, and
    each statement sent on the driver's own connection (:class:`DriverSession`, which
    SQLAlchemy's events do not see).

    SQLAlchemy fires its ``begin`` and ``commit`` events on an AUTOCOMMIT connection too, but
    sends nothing to the server there, so those are not counted.
    """

    def __init__(self) -> None:
        self.count = 0

    def watch(self, engine: Engine) -> None:
        event.listen(engine, "before_cursor_execute", self._one)
        for name in ("begin", "commit"):
            event.listen(engine, name, self._sent)
        first = DriverSession.first

        async def counted(driver: DriverSession, *args: Any) -> Any:
            self.count += 1
            return await first(driver, *args)

        DriverSession.first = counted  # type: ignore[method-assign]

    def _one(self, *args: Any, **kwargs: Any) -> None:
        self.count += 1

    def _sent(self, connection: Any) -> None:
        if connection.get_execution_options().get("isolation_level") != "AUTOCOMMIT":
            self.count += 1


class Timed:
    """Time inside and outside the wrapped calls of the durable model and toolset, and the
    round trips each durable tool call makes."""

    def __init__(self, trips: RoundTrips) -> None:
        self.tool: list[float] = []
        self.model: list[float] = []
        self.tool_trips: list[int] = []
        self.trips = trips

    def install(self) -> None:
        original_request = DurableModel.request
        original_call = DurableToolset.call_tool
        inner: list[float] = [0.0]

        async def request(model: DurableModel, *args: Any) -> Any:
            wrapped_request = model.wrapped.request

            async def timed_inner(*a: Any) -> Any:
                started = time.perf_counter()
                try:
                    return await wrapped_request(*a)
                finally:
                    inner[0] += time.perf_counter() - started

            model.wrapped.request = timed_inner  # type: ignore[method-assign]
            inner[0] = 0.0
            started = time.perf_counter()
            try:
                return await original_request(model, *args)
            finally:
                self.model.append(time.perf_counter() - started - inner[0])
                del model.wrapped.request

        async def call_tool(toolset: DurableToolset[Any], *args: Any) -> Any:
            wrapped_call = toolset.wrapped.call_tool
            spent = [0.0]

            async def timed_inner(*a: Any) -> Any:
                started = time.perf_counter()
                try:
                    return await wrapped_call(*a)
                finally:
                    spent[0] += time.perf_counter() - started

            toolset.wrapped.call_tool = timed_inner  # type: ignore[method-assign]
            trips_before = self.trips.count
            started = time.perf_counter()
            try:
                return await original_call(toolset, *args)
            finally:
                self.tool.append(time.perf_counter() - started - spent[0])
                self.tool_trips.append(self.trips.count - trips_before)
                del toolset.wrapped.call_tool

        DurableModel.request = request  # type: ignore[method-assign]
        DurableToolset.call_tool = call_tool  # type: ignore[method-assign]


def pct(values: list[float], q: float) -> float:
    """The ``q`` quantile (0-1) of ``values`` in seconds, in milliseconds."""
    return percentile(values, q * 100) * 1000


async def commit_floor(engine: Any, count: int) -> tuple[float, float, float]:
    """p50 ms of a ``SELECT 1`` round trip, of a one-row INSERT committed in autocommit
    (its log flushed to the disk), and of the same INSERT with ``synchronous_commit = off``."""
    async with engine.connect() as connection:
        connection = await connection.execution_options(isolation_level="AUTOCOMMIT")
        await connection.exec_driver_sql("CREATE TABLE bench_commit_floor (id bigserial)")
        figures = []
        for statement in (
            "SELECT 1",
            "INSERT INTO bench_commit_floor DEFAULT VALUES",
            "WITH off AS (SELECT set_config('synchronous_commit', 'off', true)) "
            "INSERT INTO bench_commit_floor SELECT nextval('bench_commit_floor_id_seq') "
            "FROM off",
        ):
            times = []
            for _ in range(count):
                started = time.perf_counter()
                await connection.exec_driver_sql(statement)
                times.append(time.perf_counter() - started)
            figures.append(pct(times, 0.5))
        await connection.exec_driver_sql("DROP TABLE bench_commit_floor")
    return figures[0], figures[1], figures[2]


async def main_async(calls: int) -> None:
    trips = RoundTrips()
    timed = Timed(trips)
    timed.install()
    with postgres_database() as url:
        engine = make_async_engine(url, pool_size=5, max_overflow=0)
        trips.watch(engine.sync_engine)
        sessions = async_sessionmaker(engine, expire_on_commit=False)
        agent, model = build()
        durable = DurableAgent(agent, version=1)
        fast_store = ActionStore(durable_finish=False)
        bare: list[float] = []
        runs: dict[bool, list[float]] = {True: [], False: []}
        tools: dict[bool, list[float]] = {True: [], False: []}
        models: dict[bool, list[float]] = {True: [], False: []}
        per_round = max(1, calls // ROUNDS)
        try:
            select_ms, flushed_ms, unflushed_ms = await commit_floor(engine, 500)
            for round_ in range(ROUNDS):
                for _ in range(per_round):
                    started = time.perf_counter()
                    await agent.run("where is o-1?", model=model)
                    bare.append(time.perf_counter() - started)
                for durable_finish in (True, False):
                    timed.tool, timed.model = tools[durable_finish], models[durable_finish]
                    for i in range(per_round):
                        run = AgentRun(
                            sessions,
                            tenant="bench",
                            run_id=f"run-{durable_finish}-{round_}-{i}",
                            **({} if durable_finish else {"store": fast_store}),
                        )
                        started = time.perf_counter()
                        await durable.run(run, "where is o-1?", model=model)
                        runs[durable_finish].append(time.perf_counter() - started)
        finally:
            await engine.dispose()
    rows = [
        ["SELECT 1 (a round trip)", 500, select_ms, ""],
        ["one-row INSERT, autocommit (the log flushed)", 500, flushed_ms, ""],
        ["one-row INSERT, synchronous_commit off", 500, unflushed_ms, ""],
        ["run, bare pydantic-ai", len(bare), pct(bare, 0.5), pct(bare, 0.99)],
    ]
    for durable_finish, label in (
        (True, "durable finish (default)"),
        (False, "durable_finish=False"),
    ):
        rows += [
            [f"tool call added, {label}", len(tools[durable_finish]),
             pct(tools[durable_finish], 0.5), pct(tools[durable_finish], 0.99)],
            [f"model request added, {label}", len(models[durable_finish]),
             pct(models[durable_finish], 0.5), pct(models[durable_finish], 0.99)],
            [f"run, durable, {label}", len(runs[durable_finish]),
             pct(runs[durable_finish], 0.5), pct(runs[durable_finish], 0.99)],
        ]  # fmt: skip
    data = {
        "calls": calls,
        "select_ms_p50": select_ms,
        "flushed_commit_ms_p50": flushed_ms,
        "unflushed_commit_ms_p50": unflushed_ms,
        "tool_added_ms_p50": pct(tools[True], 0.5),
        "tool_added_fast_finish_ms_p50": pct(tools[False], 0.5),
        "tool_round_trips_median": statistics.median(timed.tool_trips),
        "model_added_ms_p50": pct(models[True], 0.5),
        "bare_run_ms_p50": pct(bare, 0.5),
        "durable_run_ms_p50": pct(runs[True], 0.5),
        "durable_run_fast_finish_ms_p50": pct(runs[False], 0.5),
    }
    report("agents", "pydantic-ai durability on PostgreSQL", ["what", "n", "p50 ms", "p99 ms"],
           rows, data)  # fmt: skip
    print(
        f"database round trips per durable tool call (BEGIN, statements, COMMIT): "
        f"{statistics.median(timed.tool_trips):g} (median of {len(timed.tool_trips)})"
    )
    print(
        f"a tool call's claim and finish are two commits; each flushed commit costs "
        f"{flushed_ms:.2f} ms here: the default's floor is {2 * flushed_ms:.2f} ms, "
        f"durable_finish=False's {flushed_ms + unflushed_ms:.2f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.agents")
    parser.add_argument("--calls", type=int, default=1000)
    asyncio.run(main_async(parser.parse_args().calls))


if __name__ == "__main__":
    main()
