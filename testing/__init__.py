"""A test kit for suites that use outboxkit, and for outboxkit's own: real components, no fakes.

- :class:`KafkaBroker` runs a real single-node Apache Kafka broker (KRaft) on 127.0.0.1 from
  the Maven Central jars, without Docker; :func:`broker_from_env` reuses
  ``OUTBOXKIT_KAFKA_BOOTSTRAP`` or starts one; :func:`create_topic` makes a topic.
- :class:`KafkaCluster` runs three such nodes as one replicated cluster (replication factor 3,
  ``min.insync.replicas`` 2), with helpers to find a partition's leader and to kill, stop,
  restart, freeze and thaw it, and a rolling restart.
- :func:`throwaway_database` creates a fresh, migrated PostgreSQL database on the server named by
  ``OUTBOXKIT_TEST_PG_URL`` and drops it afterwards (needs the ``outboxkit[testing]`` extra).
- :func:`outboxkit.testing.patroni.patroni_cluster` runs PostgreSQL with failover (Patroni,
  etcd and HAProxy from Debian's packages), with switchover and failover helpers.
- :func:`start_cli`, :func:`terminate` and :func:`kill` run ``outboxkit`` commands as child
  processes, to stop them as an operator or a crash would.
"""

from outboxkit.testing.kafka import KafkaBroker, broker_from_env, create_topic
from outboxkit.testing.kafka_cluster import KafkaCluster
from outboxkit.testing.postgres import throwaway_database
from outboxkit.testing.processes import kill, start_cli, terminate

__all__ = [
    "KafkaBroker",
    "KafkaCluster",
    "broker_from_env",
    "create_topic",
    "kill",
    "start_cli",
    "terminate",
    "throwaway_database",
]
