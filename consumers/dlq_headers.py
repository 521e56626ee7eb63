"""Names of the Kafka headers a dead-letter record gains, shared by the consumer and the tools.

A dead-letter record keeps the original key, value and headers; these are added beside them.
Values are UTF-8 strings; times are epoch milliseconds. No payload and no secret goes here.
"""

ERROR_CLASS = "outboxkit-error-class"
"""Category and exception, e.g. ``permanent:ValidationError`` or ``exhausted:TimeoutError``."""
ERROR_MESSAGE = "outboxkit-error-message"
"""A short message (at most 300 characters), never the payload."""
ORIGINAL_TOPIC = "outboxkit-original-topic"
ORIGINAL_PARTITION = "outboxkit-original-partition"
ORIGINAL_OFFSET = "outboxkit-original-offset"
ORIGINAL_TIMESTAMP = "outboxkit-original-timestamp"
CONSUMER_GROUP = "outboxkit-consumer-group"
ATTEMPTS = "outboxkit-attempts"
FIRST_FAILURE_MS = "outboxkit-first-failure-ms"
LAST_FAILURE_MS = "outboxkit-last-failure-ms"

ALL = (
    ERROR_CLASS,
    ERROR_MESSAGE,
    ORIGINAL_TOPIC,
    ORIGINAL_PARTITION,
    ORIGINAL_OFFSET,
    ORIGINAL_TIMESTAMP,
    CONSUMER_GROUP,
    ATTEMPTS,
    FIRST_FAILURE_MS,
    LAST_FAILURE_MS,
)
