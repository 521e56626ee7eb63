"""The relay: publishes committed outbox rows to Kafka, in order per key."""
