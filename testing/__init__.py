"""Development helpers: a real single-node Apache Kafka broker without Docker."""
