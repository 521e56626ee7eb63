"""An agent that refunds a customer exactly once, even when the provider's reply is lost.

Run ``python -m examples.refund_agent`` (database from ``OUTBOXKIT_DB_URL``, default a SQLite
file). The payment provider is a real HTTP server on loopback that honours ``Idempotency-Key``.
"""
