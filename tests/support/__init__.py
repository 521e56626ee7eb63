"""Helpers shared by the test suite: Kafka, consumers, operator commands, agent actions."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
"""The repository's root, from which subprocesses import ``examples`` and ``tests``."""
