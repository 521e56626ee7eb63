"""Runnable examples of outboxkit (``python -m examples.<name>``)."""
