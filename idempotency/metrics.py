"""Prometheus metrics of the HTTP idempotency middleware.

One counter by outcome; labels never hold keys, scopes, paths or bodies.
"""

from __future__ import annotations

from enum import Enum

from prometheus_client import Counter


class Outcome(Enum):
    """What the middleware did with one request that named (or needed) a key."""

    EXECUTED = "executed"
    """Claimed; the handler ran and its response was stored."""
    REPLAYED = "replayed"
    """A completed key: the stored response was sent again."""
    CONFLICT = "conflict"
    """422: the key was used with another request."""
    IN_PROGRESS = "in_progress"
    """409: the first request with the key is still running."""
    MISSING_KEY = "missing_key"
    """400: no (usable) key, or no scope, on a route that requires one."""
    RELEASED = "released"
    """The handler failed or answered 5xx: nothing stored, the claim released, a retry runs."""
    LEASE_LOST = "lease_lost"
    """The request outlived its lease and another took the key over."""
    BODY_INCOMPLETE = "body_incomplete"
    """The client went away before the body was complete: the handler did not run."""
    BODY_TOO_LARGE = "body_too_large"
    """413: the body is larger than the route's limit."""
    BODY_TIMEOUT = "body_timeout"
    """408: the body did not arrive within the body deadline."""


REQUESTS = Counter(
    "outboxkit_http_idempotency_requests",
    "Requests on idempotent routes, by what the middleware did with them.",
    ["outcome"],
)
