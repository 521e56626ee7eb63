"""The consumer runtime: inbox-deduplicated handlers, retries and a dead-letter topic."""
