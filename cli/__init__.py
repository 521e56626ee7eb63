"""The ``outboxkit`` command line, on top of every other package; nothing imports it."""
