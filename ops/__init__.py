"""Operator tools: status, parked outbox rows, and reading, grouping and replaying dead letters."""
