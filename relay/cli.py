"""``outboxkit relay``."""
