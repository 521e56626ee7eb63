"""``outboxkit idempotency purge`` deletes expired keys, never one still in progress."""

from __future__ import annotations

import time

from outboxkit.idempotency import IdempotencyStore
from outboxkit.idempotency.fingerprint import fingerprint
from outboxkit.idempotency.store import ClaimKind
from outboxkit.idempotency.tables import http_idempotency_keys

from tests.idempotency.test_http import count
from tests.support.actions import sessions_for
from tests.support.ops import cli


async def test_purge_deletes_expired_keys_but_not_live_claims(db_url: str) -> None:
    request = fingerprint("POST", "/x", b"", b"{}", [])
    day_ago = IdempotencyStore(clock=lambda: time.time() - 25 * 3600)
    async with sessions_for(db_url) as sessions, sessions() as session, session.begin():
        done = await day_ago.claim(session, "acme", "old-done", request)
        assert done.lease is not None
        await day_ago.complete(session, done.lease, 201, [], b"{}")
        await day_ago.claim(session, "acme", "old-crashed", request)  # lease long over
        # expired but still running: its lease (a 25-hour lease) is live
        long_lease = IdempotencyStore(clock=lambda: time.time() - 24.5 * 3600, lease_s=25 * 3600)
        await long_lease.claim(session, "acme", "old-running", request)
        fresh = await IdempotencyStore().claim(session, "acme", "fresh", request)
        assert fresh.kind is ClaimKind.EXECUTE

    result = await cli("idempotency", "purge", "--chunk-size", "1", "--db-url", db_url)
    assert (result.code, result.out.strip()) == (0, "deleted: 2")
    assert count(db_url, http_idempotency_keys) == 2
