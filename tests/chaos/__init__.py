"""The fault-injection run: every committed event applied exactly once, in order per key."""
