"""Benchmarks: each compares outboxkit side by side with a baseline in one run."""
