"""Flat cost as the tables grow (issue 27): hot paths on big tables vs the same on empty ones.

On PostgreSQL, each hot path is timed on an empty table, then after ``COPY`` has filled the
table to each size (set-up, not measured; then ``VACUUM (ANALYZE)``, as autovacuum would),
then once more after a retention pass has deleted the oldest ``--purge-fraction`` of it with
the real chunked DELETEs (their longest transaction is printed). For each it prints events/s,
p50/p99 batch time, the ratio to the empty table, table and index size, bytes per row, dead
tuples and the primary key's leaf density (``pgstattuple``). Paths:

- ``inbox``: the consumer's optimistic chunk (inbox ``claim_many`` + batch handler writing one
  effect row per event, one transaction per chunk of ``--batch`` events), with
  ``--inbox-sizes`` existing claims keyed as in production (4 consumers, 24 sources, UUIDv7
  event ids spread over the last 7 days);
- ``relay``: ``Relay.drain()`` in poll mode publishing ``--relay-events`` events of ~1 KB to a
  real broker, with ``--relay-published`` published rows kept for retention, then also
  ``--relay-parked`` parked and scheduled rows (half each);
- ``inflow``: events written at ``--inflow-rate`` for ``--inflow-seconds``, relayed and
  consumed, with outbox retention and inbox window ``--inflow-window`` seconds; table sizes
  every ``--inflow-sample`` seconds and the longest retention transaction; with
  ``--inflow-vacuum`` the outbox is also vacuumed after each big pass (an experiment: inline,
  it held retention up).

    python -m bench.growth [--paths inbox,relay,inflow] [--inbox-sizes 0,10000000,50000000]
        [--relay-published 10000000] [--relay-parked 1000000] [--inflow-rate 5000]
        [--inflow-seconds 600] [--inflow-window 90] [--inflow-vacuum]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from contextlib import ExitStack
from typing import Any

from outboxkit.actions import cleanup as actions_cleanup
from outboxkit.consumers.inbox import purge_inbox
from outboxkit.idempotency import cleanup as idempotency_cleanup
from outboxkit.relay.retention import delete_published
from sqlalchemy.ext.asyncio import async_sessionmaker

from bench import growth_stores as stores
from bench.common import kafka, percentile, postgres_database, report
from bench.consumer_app import create_effects_table
from bench.growth_inflow import inflow, summary
from bench.growth_paths import Timing, inbox_path, paired, relay_path
from bench.growth_tables import (
    WEEK_MS,
    TableStats,
    copy_inbox,
    copy_outbox,
    table_stats,
    timed_engine,
    vacuum_analyze,
)

TARGET = 0.8  # events/s at the largest size / on the empty table (inbox, relay)
LOCK_TARGET_MS = 100.0  # longest retention transaction
PATHS = ("inbox", "relay", "ledger", "idempotency", "workflows", "inflow")

Row = dict[str, Any]


def _row(path: str, size: str, timing: Timing, stats: TableStats, base: Timing | None) -> Row:
    ratio = timing.per_s / base.per_s if base and base.per_s else 1.0
    return {
        "path": path,
        "size": size,
        "events_per_s": timing.per_s,
        "p50_ms": timing.p50_ms,
        "p99_ms": timing.p99_ms,
        "ratio": ratio,
        "rows": stats.rows,
        "heap_mib": stats.heap_bytes / 2**20,
        "index_mib": stats.index_bytes / 2**20,
        "bytes_per_row": stats.bytes_per_row(),
        "dead_tuples": stats.dead_tuples,
        "free_percent": stats.free_percent,
        "pkey_leaf_density": stats.pkey_leaf_density,
        "load_1m": os.getloadavg()[0],
    }


def _say(row: Row) -> None:
    print(
        f"  {row['path']} {row['size']}: {row['events_per_s']:,.0f}/s p99 {row['p99_ms']:.1f} ms"
        f" ratio {row['ratio']:.2f}; {row['rows']:,} rows, heap {row['heap_mib']:,.0f} MiB,"
        f" indexes {row['index_mib']:,.0f} MiB, {row['dead_tuples']:,} dead"
        f" (load {row['load_1m']:.1f})",
        flush=True,
    )


def _purge(url: str, purge: Any) -> tuple[int, float, float]:
    """Run ``purge(engine)`` on a timed engine: rows removed, seconds, longest transaction.

    Also prints the median and p99 transaction and the longest row-lock hold."""

    async def go() -> tuple[int, float, float]:
        engine, timer = timed_engine(url)
        began = time.monotonic()
        try:
            removed = await purge(engine)
        finally:
            await engine.dispose()
        print(
            f"  retention transactions: {len(timer.durations_ms)}, p50 "
            f"{percentile(timer.durations_ms, 50):.0f} ms, p99 "
            f"{percentile(timer.durations_ms, 99):.0f} ms; longest row-lock hold "
            f"{timer.longest_lock_ms:.0f} ms"
        )
        return removed, time.monotonic() - began, timer.longest_ms

    return asyncio.run(go())


def bench_inbox(args: argparse.Namespace, results: dict[str, Any]) -> list[Row]:
    """The inbox path at each of ``--inbox-sizes``, then after retention."""
    rows: list[Row] = []
    with postgres_database() as empty, postgres_database() as url:
        create_effects_table(empty)
        create_effects_table(url)

        def measure() -> tuple[Timing, Timing]:
            return paired(
                lambda: asyncio.run(inbox_path(empty, args.batches, args.batch)),
                lambda: asyncio.run(inbox_path(url, args.batches, args.batch)),
                args.rounds,
            )

        filled = 0
        for size in sorted(args.inbox_sizes):
            if size > filled:
                now = int(time.time() * 1000)
                seconds = asyncio.run(copy_inbox(url, size - filled, now - WEEK_MS, now - 60_000))
                print(f"  COPY {size - filled:,} inbox rows: {seconds:.0f} s", flush=True)
                results.setdefault("fills", []).append(
                    {"table": "inbox_events", "rows": size - filled, "seconds": seconds}
                )
                filled = size
                asyncio.run(vacuum_analyze(url, "inbox_events"))
            base, timing = measure()
            stats = asyncio.run(table_stats(url, "inbox_events"))
            rows.append(_row("inbox", f"{size:,}", timing, stats, base))
            _say(rows[-1])
        window_s = WEEK_MS * (1 - args.purge_fraction) / 1000
        removed, seconds, longest = _purge(
            url, lambda engine: purge_inbox(engine, older_than_s=window_s)
        )
        print(
            f"  inbox retention: {removed:,} rows in {seconds:.0f} s, longest tx {longest:.0f} ms"
        )
        results["inbox_retention"] = {
            "removed": removed,
            "seconds": seconds,
            "longest_tx_ms": longest,
        }
        stats = asyncio.run(table_stats(url, "inbox_events"))
        base, timing = measure()
        rows.append(_row("inbox", f"{filled:,} after retention", timing, stats, base))
        _say(rows[-1])
    return rows


def bench_relay(args: argparse.Namespace, bootstrap: str, results: dict[str, Any]) -> list[Row]:
    """The relay empty, with published rows kept, with parked/scheduled rows, after retention."""
    rows: list[Row] = []
    with postgres_database() as empty, postgres_database() as url:

        def measure() -> tuple[Timing, Timing]:
            return paired(
                lambda: relay_path(empty, bootstrap, args.relay_events),
                lambda: relay_path(url, bootstrap, args.relay_events),
                args.rounds,
            )

        stats = lambda: asyncio.run(table_stats(url, "outbox_events"))  # noqa: E731
        base, timing = measure()
        rows.append(_row("relay", "empty", base, stats(), base))
        rows.append(_row("relay", "empty (2nd database)", timing, stats(), base))
        _say(rows[-1])
        now = int(time.time() * 1000)
        fills = [
            ("published", args.relay_published, f"{args.relay_published:,} published"),
            ("parked", args.relay_parked // 2, None),
            (
                "scheduled",
                args.relay_parked - args.relay_parked // 2,
                f"+ {args.relay_parked:,} parked/scheduled",
            ),
        ]
        for state, count, label in fills:
            seconds = asyncio.run(
                copy_outbox(
                    url, count, now - WEEK_MS, now - 60_000, state=state,
                    payload_bytes=args.relay_payload,
                )
            )  # fmt: skip
            print(f"  COPY {count:,} {state} outbox rows: {seconds:.0f} s", flush=True)
            results.setdefault("fills", []).append(
                {"table": f"outbox_events ({state})", "rows": count, "seconds": seconds}
            )
            if label is None:
                continue
            asyncio.run(vacuum_analyze(url, "outbox_events"))
            base, timing = measure()
            rows.append(_row("relay", label, timing, stats(), base))
            _say(rows[-1])
        retention_ms = int(WEEK_MS * (1 - args.purge_fraction))
        removed, seconds, longest = _purge(
            url, lambda engine: delete_published(engine, retention_ms, 5000)
        )
        print(
            f"  outbox retention: {removed:,} rows in {seconds:.0f} s, longest tx {longest:.0f} ms"
        )
        results["outbox_retention"] = {
            "removed": removed,
            "seconds": seconds,
            "longest_tx_ms": longest,
        }
        base, timing = measure()
        rows.append(_row("relay", "after retention", timing, stats(), base))
        _say(rows[-1])
    return rows


STORE_SIZES = {
    "ledger": ("ledger_ops", "finished operations"),
    "idempotency": ("idempotency_keys", "stored keys"),
    "workflows": ("workflow_instances", "instances"),
}
RETENTION = {
    "ledger": actions_cleanup.purge_expired,
    "idempotency": idempotency_cleanup.purge_expired,
}


def bench_store(kind: str, args: argparse.Namespace, results: dict[str, Any]) -> list[Row]:
    """A store's hot path empty, at its size, and (ledger, idempotency) after retention."""
    rows: list[Row] = []
    table = stores.TABLES[kind]
    count = getattr(args, STORE_SIZES[kind][0])
    with postgres_database() as empty, postgres_database() as url:

        def measure() -> tuple[Timing, Timing]:
            return paired(
                lambda: asyncio.run(stores.PATHS[kind](empty, args.calls)),
                lambda: asyncio.run(stores.PATHS[kind](url, args.calls)),
                args.rounds,
            )

        stats = lambda: asyncio.run(table_stats(url, table))  # noqa: E731
        base, timing = measure()
        rows.append(_row(kind, "empty", base, stats(), base))
        rows.append(_row(kind, "empty (2nd database)", timing, stats(), base))
        _say(rows[-1])
        expired = int(count * args.purge_fraction) if kind in RETENTION else 0
        per = args.workflow_history
        seconds = asyncio.run(
            stores.fill(url, kind, count, history_per_instance=per, expired=expired)
        )
        label = f"{count:,} {STORE_SIZES[kind][1]}"
        if kind == "workflows":
            label += f", {count * per:,} history rows"
        print(f"  fill {label}: {seconds:.0f} s", flush=True)
        results.setdefault("fills", []).append({"table": table, "rows": count, "seconds": seconds})
        for name in {table, "workflow_instances" if kind == "workflows" else table}:
            asyncio.run(vacuum_analyze(url, name))
        base, timing = measure()
        rows.append(_row(kind, label, timing, stats(), base))
        _say(rows[-1])
        if kind == "workflows":
            assert asyncio.run(stores.check_workflows_done(url)) == 0, "a workflow did not finish"
            return rows
        purge = RETENTION[kind]
        removed, seconds, longest = _purge(
            url, lambda engine: purge(async_sessionmaker(engine, expire_on_commit=False))
        )
        print(
            f"  {kind} retention: {removed:,} rows in {seconds:.0f} s, longest tx {longest:.0f} ms"
        )
        results[f"{kind}_retention"] = {
            "removed": removed,
            "seconds": seconds,
            "longest_tx_ms": longest,
        }
        base, timing = measure()
        rows.append(_row(kind, "after retention", timing, stats(), base))
        _say(rows[-1])
    return rows


def bench_inflow(args: argparse.Namespace, bootstrap: str, results: dict[str, Any]) -> None:
    """Retention under inflow; prints sizes as it goes, stores the figures in ``results``."""
    with postgres_database() as url:
        create_effects_table(url)
        result = asyncio.run(
            inflow(
                url, bootstrap, rate=args.inflow_rate, seconds=args.inflow_seconds,
                window_s=args.inflow_window, sample_s=args.inflow_sample,
                retention_every_s=args.inflow_retention_every,
                vacuum=args.inflow_vacuum,
            )
        )  # fmt: skip
    figures = summary(result)
    results["inflow"] = figures | {
        "target_rate": args.inflow_rate,
        "window_s": args.inflow_window,
        "longest_holds": result.longest_holds,
        "inbox_longest_holds": sorted(result.inbox_holds, reverse=True)[:5],
        "vacuum": args.inflow_vacuum,
        "server": result.server,
        "disk": result.disk,
        "samples": [
            {
                "at_s": s.at_s,
                "written": s.written,
                "consumed": s.consumed,
                "outbox_rows": s.outbox.rows,
                "outbox_bytes": s.outbox.total_bytes,
                "outbox_dead": s.outbox.dead_tuples,
                "inbox_rows": s.inbox.rows,
                "inbox_bytes": s.inbox.total_bytes,
                "inbox_dead": s.inbox.dead_tuples,
                "load": s.load,
            }
            for s in result.samples
        ],
    }
    print(
        f"inflow: wrote {figures['write_per_s']:,.0f}/s (target {args.inflow_rate:,.0f}), "
        f"applied {figures['consume_per_s']:,.0f}/s; longest retention tx: outbox "
        f"{figures['outbox_purge_longest_ms']:.0f} ms, "
        f"inbox {figures['inbox_purge_longest_ms']:.0f} ms (p50 {figures['purge_p50_ms']:.0f}, "
        f"p99 {figures['purge_p99_ms']:.0f}); longest row-lock hold: outbox "
        f"{figures['outbox_lock_longest_ms']:.0f} ms, inbox {figures['inbox_lock_longest_ms']:.0f}"
        f" ms (target <= {LOCK_TARGET_MS:.0f} ms); outbox p99 tx "
        f"{figures['outbox_purge_p99_ms']:.0f} ms, lock {figures['outbox_lock_p99_ms']:.0f} ms; "
        f"inbox p99 lock {figures['inbox_lock_p99_ms']:.0f} ms; locked blocks inside the "
        f"server: outbox longest {figures['outbox_server_longest_ms']:.0f} ms "
        f"({figures['outbox_block_rows_longest_held']:.0f} rows; p99 "
        f"{figures['outbox_server_p99_ms']:.0f} ms; rows p50 "
        f"{figures['outbox_block_rows_p50']:.0f}), inbox longest "
        f"{figures['inbox_server_longest_ms']:.0f} ms (p99 {figures['inbox_server_p99_ms']:.0f}); "
        f"{figures['outbox_vacuums']:.0f} outbox VACUUMs, longest "
        f"{figures['outbox_vacuum_longest_ms']:.0f} ms"
    )
    print(
        f"  the bench's event loop woke late: p99 {figures['loop_lag_p99_ms']:.0f} ms, "
        f"longest {figures['loop_lag_longest_ms']:.0f} ms"
    )
    print(f"  the server during the run: {result.server}")
    print(f"  the machine's disks during the run: {result.disk}")
    for held_ms, statement in result.longest_holds:
        print(f"  lock held {held_ms:6.0f} ms from: {statement}")
    for held_ms, statement in sorted(result.inbox_holds, reverse=True)[:5]:
        print(f"  inbox lock held {held_ms:6.0f} ms from: {statement}")


def _sizes(text: str) -> list[int]:
    return [int(float(part)) for part in text.split(",") if part]


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--paths", default=",".join(PATHS), help=f"of {', '.join(PATHS)}")
    parser.add_argument("--inbox-sizes", type=_sizes, default=[0, 10_000_000, 50_000_000])
    parser.add_argument("--batch", type=int, default=500, help="events per consumer chunk")
    parser.add_argument("--batches", type=int, default=40, help="chunks timed per round")
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="measurements per size, alternating with an empty database",
    )
    parser.add_argument("--relay-events", type=int, default=20_000)
    parser.add_argument("--relay-published", type=lambda s: int(float(s)), default=10_000_000)
    parser.add_argument("--relay-parked", type=lambda s: int(float(s)), default=1_000_000)
    parser.add_argument("--relay-payload", type=int, default=300, help="bytes per filled row")
    parser.add_argument("--ledger-ops", type=lambda s: int(float(s)), default=10_000_000)
    parser.add_argument("--idempotency-keys", type=lambda s: int(float(s)), default=10_000_000)
    parser.add_argument("--workflow-instances", type=lambda s: int(float(s)), default=1_000_000)
    parser.add_argument("--workflow-history", type=int, default=20, help="rows per instance")
    parser.add_argument(
        "--calls", type=int, default=200, help="ledger/idempotency/workflow calls timed"
    )
    parser.add_argument("--name", default="growth", help="writes bench/results/NAME.json")
    parser.add_argument("--purge-fraction", type=float, default=0.1)
    parser.add_argument("--inflow-rate", type=float, default=5000)
    parser.add_argument("--inflow-seconds", type=float, default=600)
    parser.add_argument("--inflow-window", type=float, default=90)
    parser.add_argument("--inflow-sample", type=float, default=60)
    parser.add_argument("--inflow-retention-every", type=float, default=10)
    parser.add_argument(
        "--inflow-vacuum",
        action="store_true",
        help="VACUUM the outbox after each retention pass of 10,000 rows or more (inline)",
    )
    args = parser.parse_args(argv)
    args.paths = [p for p in args.paths.split(",") if p]
    if unknown := set(args.paths) - set(PATHS):
        parser.error(f"unknown path(s): {', '.join(sorted(unknown))}")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the chosen paths, print the table and the ratios; return what was written."""
    args = parse(argv)
    os.environ.setdefault("COLUMNS", "180")  # rich's table width when not on a terminal
    results: dict[str, Any] = {"load_before": os.getloadavg()}
    rows: list[Row] = []
    with ExitStack() as stack:
        if "inbox" in args.paths:
            rows += bench_inbox(args, results)
        for kind in ("ledger", "idempotency", "workflows"):
            if kind in args.paths:
                rows += bench_store(kind, args, results)
        if {"relay", "inflow"} & set(args.paths):
            bootstrap = stack.enter_context(kafka())
            if "relay" in args.paths:
                rows += bench_relay(args, bootstrap, results)
            if "inflow" in args.paths:
                bench_inflow(args, bootstrap, results)
    load = os.getloadavg()
    results |= {
        "rows": rows,
        "load_after": load,
        "target": TARGET,
        "lock_target_ms": LOCK_TARGET_MS,
    }
    columns = ["path", "size", "events/s", "p50 ms", "p99 ms", "ratio", "rows", "heap MiB",
               "index MiB", "B/row", "dead", "pkey leaf %", "load"]  # fmt: skip
    keys = ["path", "size", "events_per_s", "p50_ms", "p99_ms", "ratio", "rows", "heap_mib",
            "index_mib", "bytes_per_row", "dead_tuples", "pkey_leaf_density",
            "load_1m"]  # fmt: skip
    report(
        args.name,
        "Hot paths as the tables grow, PostgreSQL "
        f"(load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f})",
        columns,
        [[row[k] for k in keys] for row in rows],
        results,
    )
    for path in ("inbox", "relay", *STORE_SIZES):
        mine = [row for row in rows if row["path"] == path and "after" not in row["size"]]
        if len(mine) > 1:
            target = f" (target >= {TARGET})" if path in ("inbox", "relay") else ""
            print(f"ratio {path} at {mine[-1]['size']} / empty = {mine[-1]['ratio']:.2f}{target}")
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    return results


if __name__ == "__main__":
    main()
