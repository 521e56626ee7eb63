"""HTTP idempotency overhead: requests per second of one endpoint, with and without the
middleware, in one run.

A uvicorn process serves the endpoint twice (``bench.http_app``): plain, and through
``IdempotencyMiddleware`` in transactional mode (every request a new key: claim, work and
completion, the most expensive path). An httpx client with ``--concurrency`` connections
sends alternating rounds to both sides, so drift in the machine's load hits both alike.
PostgreSQL (a throwaway database on ``OUTBOXKIT_TEST_PG_URL``). Usage:

    python -m bench.http_idempotency [--requests 4000] [--rounds 8] [--concurrency 16]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
from outboxkit.outbox.db import make_engine

from bench.common import postgres_database, report
from bench.http_app import orders_metadata

REPO = Path(__file__).resolve().parent.parent


async def run_side(client: httpx.AsyncClient, path: str, count: int, concurrency: int) -> float:
    """Seconds for ``count`` requests to ``path``, ``concurrency`` at a time; each must be 201."""
    remaining = iter(range(count))

    async def worker() -> None:
        for n in remaining:
            response = await client.post(
                path,
                json={"customer": f"c{n % 100}", "amount_cents": 100 + n},
                headers={"X-Tenant": "bench", "Idempotency-Key": uuid.uuid4().hex},
            )
            if response.status_code != 201:
                raise RuntimeError(f"{path} answered {response.status_code}: {response.text}")

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.perf_counter() - started


async def measure(base_url: str, args: argparse.Namespace) -> tuple[float, float]:
    """Total seconds of the plain and the idempotent side over all rounds."""
    limits = httpx.Limits(max_connections=args.concurrency)
    async with httpx.AsyncClient(base_url=base_url, timeout=60, limits=limits) as client:
        for path in ("/plain/orders", "/idem/orders"):  # warm-up: connections, caches
            await run_side(client, path, 200, args.concurrency)
        per_round = args.requests // args.rounds
        plain = idem = 0.0
        for _ in range(args.rounds):
            plain += await run_side(client, "/plain/orders", per_round, args.concurrency)
            idem += await run_side(client, "/idem/orders", per_round, args.concurrency)
    return plain, idem


async def wait_serving(base_url: str, server: subprocess.Popen[bytes]) -> None:
    """Until the server accepts a request (or fail if it exited)."""
    deadline = time.monotonic() + 60
    async with httpx.AsyncClient(base_url=base_url, timeout=2) as client:
        while time.monotonic() < deadline:
            if server.poll() is not None:
                raise RuntimeError(f"the server exited with {server.returncode}")
            try:
                await client.get("/")
                return
            except httpx.TransportError:
                await asyncio.sleep(0.1)
    raise TimeoutError("the server did not start")


def main() -> None:
    """Run both sides against one server process and print the ratio of request rates."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=4000, help="per side, over all rounds")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    with postgres_database() as url, socket.create_server(("127.0.0.1", 0)) as sock:
        engine = make_engine(url)
        orders_metadata.create_all(engine)
        engine.dispose()
        command = [sys.executable, "-m", "uvicorn", "bench.http_app:app"]
        command += ["--fd", str(sock.fileno()), "--no-access-log", "--log-level", "warning"]
        server = subprocess.Popen(
            command,
            pass_fds=[sock.fileno()],
            cwd=REPO,
            env={**os.environ, "OUTBOXKIT_DB_URL": url, "PYTHONPATH": str(REPO)},
        )
        try:
            base_url = f"http://127.0.0.1:{sock.getsockname()[1]}"
            asyncio.run(wait_serving(base_url, server))
            plain, idem = asyncio.run(measure(base_url, args))
        finally:
            server.terminate()
            server.wait(30)
    count = args.requests // args.rounds * args.rounds
    plain_rate, idem_rate = count / plain, count / idem
    ratio = plain_rate / idem_rate
    report(
        "http_idempotency",
        f"{count:,} requests per side, {args.concurrency} concurrent, PostgreSQL, one uvicorn",
        ["side", "seconds", "requests/s", "ms per request"],
        [
            ["plain endpoint", plain, plain_rate, plain / count * 1000 * args.concurrency],
            ["with IdempotencyMiddleware", idem, idem_rate, idem / count * 1000 * args.concurrency],
        ],
        {
            "requests": count,
            "concurrency": args.concurrency,
            "plain_seconds": plain,
            "idempotent_seconds": idem,
            "plain_rps": plain_rate,
            "idempotent_rps": idem_rate,
            "overhead": ratio,
            "target": 1.3,
        },
    )
    print(f"overhead plain/idempotent = {ratio:.2f} (target <= 1.3)")


if __name__ == "__main__":
    main()
