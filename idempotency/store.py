"""Claiming, completing and releasing idempotency keys, in the caller's transaction.

The claim is an ``INSERT ... ON CONFLICT (scope, idem_key) DO NOTHING``: of concurrent requests
with one key, the unique constraint lets exactly one insert; the others read the row and get a
replay, a conflict or "in progress". Every later change is a conditional ``UPDATE``/``DELETE``
whose ``WHERE`` repeats what the caller read (lease token, expiry), so under PostgreSQL's READ
COMMITTED (and SQLite's ``BEGIN IMMEDIATE``) a concurrent change makes it match nothing
instead of overwriting. The store never commits; the middleware owns the transactions.
"""

from __future__ import annotations

import hashlib
import json
import math
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, cast

from outboxkit.idempotency.fingerprint import Fingerprint
from outboxkit.idempotency.tables import COMPLETED, IN_PROGRESS, http_idempotency_keys
from outboxkit.outbox.dialects import dialect_of
from sqlalchemy import BigInteger, CursorResult, delete, literal, select, update
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.sql.elements import ColumnElement

DEFAULT_TTL_S = 24 * 3600.0
DEFAULT_LEASE_S = 30.0
MAX_SCOPE_LENGTH = 128
HASHED_SCOPE_PREFIX = "sha256:"
_CLAIM_ROUNDS = 5  # a row that vanishes or changes under us is read again, a few times

Clock = Callable[[], float]
"""Epoch seconds, like :func:`time.time`; injected in tests to move time forward."""

keys = http_idempotency_keys


class ClaimKind(Enum):
    """What a request with a key may do."""

    EXECUTE = "execute"
    REPLAY = "replay"
    CONFLICT = "conflict"
    IN_PROGRESS = "in_progress"


@dataclass(frozen=True, slots=True)
class Lease:
    """Ownership of an in-progress key: finishing calls match ``token``, so a request whose
    lease expired and was taken over cannot complete or release the new owner's claim."""

    row_id: int
    token: str


@dataclass(frozen=True, slots=True)
class StoredResponse:
    """A completed request's response, replayed byte for byte."""

    status: int
    headers: list[tuple[str, str]]
    body: bytes


@dataclass(frozen=True, slots=True)
class Claim:
    """The answer to a claim: execute under ``lease``, replay ``response``, or refuse."""

    kind: ClaimKind
    lease: Lease | None = None
    response: StoredResponse | None = None
    differing: tuple[str, ...] = ()
    retry_after_s: int = 1
    took_over: bool = False


@dataclass(frozen=True, slots=True)
class KeyRecord:
    """One key as stored (for lookups and operators; the response body is left out)."""

    scope: str
    key: str
    state: str
    response_status: int | None
    created_ms: int
    expires_ms: int
    lease_expires_ms: int | None
    now_ms: int

    @property
    def in_flight(self) -> bool:
        """An unexpired claim whose request is still running under a live lease."""
        return (
            self.state == IN_PROGRESS
            and self.expires_ms > self.now_ms
            and (self.lease_expires_ms or 0) > self.now_ms
        )


def stored_scope(scope: str) -> str:
    """The scope as stored: as given if it has at most 128 characters and does not begin with
    ``sha256:``, else ``sha256:`` and the hex SHA-256 of the whole scope (cut to 120 digits).

    No literal scope is stored with the prefix the hashed ones carry, so two distinct scopes
    share a stored form only if their hashes do: a client whose scope is
    ``sha256:<hash of another tenant's long scope>`` gets a hashed scope of its own.
    """
    if len(scope) <= MAX_SCOPE_LENGTH and not scope.startswith(HASHED_SCOPE_PREFIX):
        return scope
    return HASHED_SCOPE_PREFIX + hashlib.sha256(scope.encode()).hexdigest()[:120]


class IdempotencyStore:
    """The key table's operations; each takes the caller's session and never commits.

    ``ttl_s`` (default 24 h) counts from the first claim: after it, the key is a new operation.
    ``lease_s`` (default 30 s) is how long a claim stays "in progress" without completing; after
    it the key may be claimed again. ``clock`` replaces the database clock (tests only).
    """

    def __init__(
        self,
        *,
        ttl_s: float = DEFAULT_TTL_S,
        lease_s: float = DEFAULT_LEASE_S,
        clock: Clock | None = None,
    ) -> None:
        if not ttl_s > 0 or not lease_s > 0:
            raise ValueError("ttl_s and lease_s must be positive")
        self.ttl_ms = round(ttl_s * 1000)
        self.lease_ms = round(lease_s * 1000)
        self.clock = clock

    def now(self, session: AsyncSession) -> ColumnElement[int]:
        """The current time in epoch ms as SQL: the injected clock's, else the database's."""
        if self.clock is not None:
            return literal(math.floor(self.clock() * 1000), BigInteger)
        return dialect_of(session).now_ms()

    async def claim(
        self, session: AsyncSession, scope: str, key: str, request: Fingerprint
    ) -> Claim:
        """Claim ``key`` for this request, or say why it may not run now."""
        scope = stored_scope(scope)
        for _ in range(_CLAIM_ROUNDS):
            token = str(uuid.uuid4())
            now = self.now(session)
            inserted = await session.execute(
                dialect_of(session)
                .insert(keys)
                .values(
                    scope=scope,
                    idem_key=key,
                    fingerprint=request.digest,
                    fingerprint_parts=request.to_json(),
                    state=IN_PROGRESS,
                    lease_token=token,
                    lease_expires_ms=now + self.lease_ms,
                    created_ms=now,
                    expires_ms=now + self.ttl_ms,
                )
                .on_conflict_do_nothing(index_elements=["scope", "idem_key"])
                .returning(keys.c.id)
            )
            row_id = inserted.scalar()
            if row_id is not None:
                return Claim(ClaimKind.EXECUTE, lease=Lease(row_id, token))
            row = (
                await session.execute(
                    select(keys, self.now(session).label("now_ms")).where(
                        keys.c.scope == scope, keys.c.idem_key == key
                    )
                )
            ).first()
            if row is None:
                continue  # released between our insert and our read: try the insert again
            decided = await self._decide(session, row, request, token)
            if decided is not None:
                return decided
        return Claim(ClaimKind.IN_PROGRESS)

    async def _decide(
        self, session: AsyncSession, row: Any, request: Fingerprint, token: str
    ) -> Claim | None:
        """The claim for an existing row; ``None`` if the row changed under us (read again)."""
        now_ms: int = row.now_ms
        if row.expires_ms <= now_ms:
            # an expired key is a new operation, whatever it was and whatever it is now
            now = self.now(session)
            changed = await session.execute(
                update(keys)
                .where(keys.c.id == row.id, keys.c.expires_ms <= now)
                .values(
                    fingerprint=request.digest,
                    fingerprint_parts=request.to_json(),
                    state=IN_PROGRESS,
                    lease_token=token,
                    lease_expires_ms=now + self.lease_ms,
                    response_status=None,
                    response_headers=None,
                    response_body=None,
                    created_ms=now,
                    completed_ms=None,
                    expires_ms=now + self.ttl_ms,
                )
            )
            if _rowcount(changed) == 1:
                return Claim(ClaimKind.EXECUTE, lease=Lease(row.id, token), took_over=True)
            return None
        if row.fingerprint != request.digest:
            differing = tuple(request.differing(row.fingerprint_parts))
            return Claim(ClaimKind.CONFLICT, differing=differing)
        if row.state == COMPLETED:
            response = StoredResponse(
                status=row.response_status,
                headers=[(name, value) for name, value in json.loads(row.response_headers)],
                body=bytes(row.response_body),
            )
            return Claim(ClaimKind.REPLAY, response=response)
        lease_left_ms = (row.lease_expires_ms or 0) - now_ms
        if lease_left_ms > 0:
            retry_after_s = max(1, math.ceil(lease_left_ms / 1000))
            return Claim(ClaimKind.IN_PROGRESS, retry_after_s=retry_after_s)
        # in progress under an expired lease: its request died (or outlived its lease)
        now = self.now(session)
        changed = await session.execute(
            update(keys)
            .where(
                keys.c.id == row.id,
                keys.c.state == IN_PROGRESS,
                keys.c.lease_token == row.lease_token,
                keys.c.lease_expires_ms <= now,
            )
            .values(lease_token=token, lease_expires_ms=now + self.lease_ms)
        )
        if _rowcount(changed) == 1:
            return Claim(ClaimKind.EXECUTE, lease=Lease(row.id, token), took_over=True)
        return None

    async def complete(
        self,
        session: AsyncSession,
        lease: Lease,
        status: int,
        headers: Sequence[tuple[str, str]],
        body: bytes,
    ) -> bool:
        """Store the response and end the claim; ``False`` if ``lease`` no longer owns the key."""
        result = await session.execute(
            update(keys)
            .where(
                keys.c.id == lease.row_id,
                keys.c.lease_token == lease.token,
                keys.c.state == IN_PROGRESS,
            )
            .values(
                state=COMPLETED,
                lease_token=None,
                lease_expires_ms=None,
                response_status=status,
                response_headers=json.dumps([list(pair) for pair in headers]),
                response_body=body,
                completed_ms=self.now(session),
            )
        )
        return _rowcount(result) == 1

    async def release(self, session: AsyncSession, lease: Lease) -> bool:
        """Forget an in-progress claim (nothing was stored): the next request executes."""
        result = await session.execute(
            delete(keys).where(
                keys.c.id == lease.row_id,
                keys.c.lease_token == lease.token,
                keys.c.state == IN_PROGRESS,
            )
        )
        return _rowcount(result) == 1

    async def lookup(self, session: AsyncSession, scope: str, key: str) -> KeyRecord | None:
        """The record of ``key`` in ``scope``, or ``None``."""
        row = (
            await session.execute(
                select(keys, self.now(session).label("now_ms")).where(
                    keys.c.scope == stored_scope(scope), keys.c.idem_key == key
                )
            )
        ).first()
        if row is None:
            return None
        return KeyRecord(
            scope=row.scope,
            key=row.idem_key,
            state=row.state,
            response_status=row.response_status,
            created_ms=row.created_ms,
            expires_ms=row.expires_ms,
            lease_expires_ms=row.lease_expires_ms,
            now_ms=row.now_ms,
        )


def _rowcount(result: Any) -> int:
    return cast("CursorResult[Any]", result).rowcount
