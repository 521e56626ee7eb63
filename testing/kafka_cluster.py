"""A real three-node Apache Kafka (KRaft) cluster on 127.0.0.1, from the same Maven jars.

Each node is a :class:`~outboxkit.testing.kafka.KafkaBroker` that is both broker and controller,
with its own ``node.id``, ports and data directory; all share one ``controller.quorum.voters``
list and one cluster id. Data is replicated as production runs it: ``default.replication.factor``
3, ``min.insync.replicas`` 2, and the offsets and transaction topics likewise. So a write with
``acks=all`` survives one node down, and fails (retriably) with two down.

The faults a cluster meets are one call each, on the node that leads a partition::

    cluster = KafkaCluster()
    cluster.start()
    leader = cluster.leader("orders", 0)
    leader.kill()      # kill -9, as a crash;    leader.stop(): a clean (controlled) shutdown
    leader.start()     # back with its data, on its ports
    leader.freeze()    # SIGSTOP: sockets open, nothing answers;    leader.thaw()
    cluster.rolling_restart()  # one node after the other, each once every replica is in sync

Every method blocks (from a running event loop, call them through ``asyncio.to_thread``).
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from outboxkit.outbox.kafka_settings import KafkaSettings
from outboxkit.testing.kafka import (
    READY_TIMEOUT_S,
    KafkaBroker,
    KafkaLauncherError,
    free_port,
    new_cluster_id,
)

REPLICATION = 3
# Each node's heap: three fit in well under 2 GiB.
NODE_HEAP = "384m"
# A follower that stops fetching leaves the ISR after this long (Kafka's default is 30 s): a
# frozen follower then holds acks=all writes back for 10 s, not 30, which keeps tests short.
REPLICA_LAG_MS = 10_000
METADATA_TIMEOUT_MS = 5_000
# The JVM's quick compiler only: on 2 cores the optimising one competes with three starting
# nodes for the CPU, and the cluster is ready in about half the time (measured 8-10 s against
# 18 s here); a test's few thousand records do not need its faster code. () for benchmarks.
QUICK_START = ("-XX:TieredStopAtLevel=1",)

T = TypeVar("T")
_HELPER_THREAD = "outboxkit-cluster-metadata"


class _QuietHelper(logging.Filter):
    """Drops aiokafka's lines logged from the helpers' own metadata queries: asking a cluster
    with a node down is what they are for, and every query would log its refused connects."""

    def filter(self, record: logging.LogRecord) -> bool:
        return threading.current_thread().name != _HELPER_THREAD


logging.getLogger("aiokafka").addFilter(_QuietHelper())
logging.getLogger("aiokafka.admin.client").addFilter(_QuietHelper())


@dataclass(frozen=True)
class PartitionState:
    """Who leads a partition and which replicas are in sync (node ids; leader -1: none)."""

    leader: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]


class KafkaCluster:
    """Three (or ``brokers``) KRaft nodes on 127.0.0.1 forming one replicated cluster."""

    def __init__(
        self,
        brokers: int = REPLICATION,
        data_dir: Path | None = None,
        auto_create_topics: bool = True,
        log_level: str = "WARN",
        ports: list[int] | None = None,
        heap: str = NODE_HEAP,
        jvm_options: tuple[str, ...] = QUICK_START,
    ) -> None:
        if brokers < 1:
            raise ValueError("a cluster needs at least one broker")
        if ports is not None and len(ports) != brokers:
            raise ValueError(f"{len(ports)} ports given for {brokers} brokers")
        self.data_dir = data_dir or Path(tempfile.mkdtemp(prefix="outboxkit-kafka-cluster-"))
        self.cluster_id = new_cluster_id()
        controller_ports = [free_port() for _ in range(brokers)]
        quorum = ",".join(
            f"{node}@127.0.0.1:{port}" for node, port in enumerate(controller_ports, start=1)
        )
        replication = min(REPLICATION, brokers)
        self.nodes = [
            KafkaBroker(
                port=(ports[node - 1] if ports else None),
                data_dir=self.data_dir / f"node-{node}",
                auto_create_topics=auto_create_topics,
                log_level=log_level,
                node_id=node,
                controller_port=controller_ports[node - 1],
                quorum=quorum,
                cluster_id=self.cluster_id,
                replication=replication,
                heap=heap,
                extra_properties={"replica.lag.time.max.ms": str(REPLICA_LAG_MS)},
                jvm_options=jvm_options,
            )
            for node in range(1, brokers + 1)
        ]
        self.start_seconds: float | None = None

    @property
    def bootstrap(self) -> str:
        """Every node's address, comma-separated, as clients are given them."""
        return ",".join(node.bootstrap for node in self.nodes)

    @property
    def kafka(self) -> KafkaSettings:
        """The client settings (PLAINTEXT, every node in the bootstrap list)."""
        return KafkaSettings(bootstrap=self.bootstrap)

    @property
    def replication(self) -> int:
        """The replication factor of new topics and internal topics."""
        return self.nodes[0].replication

    def node(self, node_id: int) -> KafkaBroker:
        """The node of ``node_id`` (1-based)."""
        for node in self.nodes:
            if node.node_id == node_id:
                return node
        raise KeyError(f"no node {node_id} in this cluster")

    def start(self, timeout: float = READY_TIMEOUT_S) -> None:
        """Format every node (side by side), start them all, and return once each answers and
        every broker is registered; :attr:`start_seconds` says how long that took."""
        started = time.monotonic()
        with ThreadPoolExecutor(len(self.nodes)) as pool:
            list(pool.map(lambda node: node.format(), self.nodes))
        for node in self.nodes:
            node.launch()
        try:
            for node in self.nodes:
                node.wait_ready(max(1.0, started + timeout - time.monotonic()))
            self._wait(
                lambda: self._registered() == len(self.nodes),
                started + timeout,
                "not every broker registered",
            )
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - started

    @property
    def exit_code(self) -> int | None:
        """The exit code of the first node found ended that should run, else ``None``."""
        for node in self.nodes:
            if node.exit_code is not None:
                return node.exit_code
        return None

    def stop(self, timeout: float = 30.0) -> None:
        """Stop every node cleanly (SIGTERM); the data stays."""
        with ThreadPoolExecutor(len(self.nodes)) as pool:
            list(pool.map(lambda node: node.stop(timeout), self.nodes))

    def close(self) -> None:
        """Stop every node and delete the cluster's data."""
        self.stop()
        shutil.rmtree(self.data_dir, ignore_errors=True)

    def partitions(self, topic: str) -> dict[int, PartitionState]:
        """Each partition of ``topic``: its leader, replicas and in-sync replicas, as the
        running nodes see them."""
        return self._run(self._partitions(topic))

    def leader(self, topic: str, partition: int = 0, timeout: float = 60.0) -> KafkaBroker:
        """The node leading ``topic``'s ``partition`` (waits while it has none)."""
        deadline = time.monotonic() + timeout
        found: list[KafkaBroker] = []

        def elected() -> bool:
            state = self.partitions(topic).get(partition)
            if state is None or state.leader < 0:
                return False
            found.append(self.node(state.leader))
            return True

        self._wait(elected, deadline, f"{topic}[{partition}] has no leader")
        return found[-1]

    def wait_leader_moved(
        self, topic: str, partition: int, away_from: KafkaBroker, timeout: float = 60.0
    ) -> KafkaBroker:
        """Wait until another node than ``away_from`` leads the partition; return it."""
        deadline = time.monotonic() + timeout
        found: list[KafkaBroker] = []

        def moved() -> bool:
            state = self.partitions(topic).get(partition)
            if state is None or state.leader in (-1, away_from.node_id):
                return False
            found.append(self.node(state.leader))
            return True

        self._wait(moved, deadline, f"{topic}[{partition}] still led by {away_from.node_id}")
        return found[-1]

    def wait_in_sync(self, topics: list[str] | None = None, timeout: float = 120.0) -> None:
        """Wait until every partition of ``topics`` (default: every topic, the internal ones
        too) has a leader and all its replicas in sync, as before a rolling restart's next
        step."""
        deadline = time.monotonic() + timeout
        self._wait(
            lambda: not self._run(self._out_of_sync(topics)),
            deadline,
            "replicas not in sync",
        )

    def rolling_restart(
        self, topics: list[str] | None = None, on_step: Callable[[KafkaBroker], None] | None = None
    ) -> None:
        """Restart the nodes one after the other with a clean shutdown, each once every
        replica is back in sync, as an upgrade is rolled out; ``on_step`` is told each node
        once it is back."""
        for node in self.nodes:
            self.wait_in_sync(topics)
            node.stop()
            node.start()
            if on_step is not None:
                on_step(node)
        self.wait_in_sync(topics)

    def _live(self) -> list[KafkaBroker]:
        return [node for node in self.nodes if node.running and not node.frozen]

    def _registered(self) -> int:
        return self._run(self._broker_count())

    async def _admin(self) -> Any:
        from aiokafka.admin import AIOKafkaAdminClient

        live = ",".join(node.bootstrap for node in self._live())
        if not live:
            raise KafkaLauncherError("no node of the cluster is running")
        admin = AIOKafkaAdminClient(
            **KafkaSettings(bootstrap=live).client_options("outboxkit-cluster"),
            request_timeout_ms=METADATA_TIMEOUT_MS,
        )
        await admin.start()
        return admin

    async def _broker_count(self) -> int:
        admin = await self._admin()
        try:
            return len((await admin.describe_cluster())["brokers"])
        finally:
            await admin.close()

    async def _partitions(self, topic: str) -> dict[int, PartitionState]:
        admin = await self._admin()
        try:
            described = await admin.describe_topics([topic])
        finally:
            await admin.close()
        return {
            found["partition"]: PartitionState(
                found["leader"], tuple(found["replicas"]), tuple(found["isr"])
            )
            for entry in described
            if entry["topic"] == topic
            for found in entry["partitions"]
        }

    async def _out_of_sync(self, topics: list[str] | None) -> list[str]:
        admin = await self._admin()
        try:
            described = await admin.describe_topics(topics)
        finally:
            await admin.close()
        return [
            f"{entry['topic']}[{found['partition']}]"
            for entry in described
            for found in entry["partitions"]
            if found["leader"] < 0 or set(found["isr"]) != set(found["replicas"])
        ] + [entry["topic"] for entry in described if not entry["partitions"]]

    @staticmethod
    def _run(work: Coroutine[Any, Any, T]) -> T:
        """Run ``work`` on an event loop of its own thread: these helpers also serve callers
        inside a running loop (through ``asyncio.to_thread``) and plain scripts."""
        results: list[T] = []
        errors: list[BaseException] = []

        def target() -> None:
            try:
                results.append(asyncio.run(work))
            except BaseException as error:  # handed to the caller's thread
                errors.append(error)

        thread = threading.Thread(target=target, name=_HELPER_THREAD)
        thread.start()
        thread.join()
        if errors:
            raise errors[0]
        return results[0]

    def _wait(self, condition: Callable[[], bool], deadline: float, what: str) -> None:
        last: BaseException | None = None
        while time.monotonic() < deadline:
            try:
                if condition():
                    return
            except Exception as error:  # a node restarting or elected meanwhile: ask again
                last = error
            time.sleep(0.3)
        cause = f" (last error: {type(last).__name__}: {last})" if last else ""
        raise KafkaLauncherError(f"{what} after the deadline{cause}; see {self.data_dir}")
