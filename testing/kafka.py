"""A real single-node Apache Kafka (KRaft) broker, fetched from Maven Central and run with Java.

There is no Docker engine on every machine, so outboxkit ships this launcher: ``mvn`` copies the
``org.apache.kafka:kafka_2.13`` broker and a log4j2 binding into a cache folder once, then each
broker gets a freshly formatted data directory and listens on 127.0.0.1 only. Internal topics use
replication factor and min ISR 1, so idempotent and transactional producers work on one node.
:mod:`.kafka_cluster` runs three of these nodes as one replicated cluster.

``KafkaBroker(security=...)`` secures the client listener: ``"ssl"`` (TLS), ``"mtls"`` (TLS with
client certificates required) or ``"sasl_ssl"`` (TLS and SASL SCRAM-SHA-512, SCRAM-SHA-256 or
PLAIN, one user made at format time), with a throwaway CA (:mod:`.certificates`). The broker's
own listeners (inter-broker, controller) stay PLAINTEXT on ports of their own, 127.0.0.1 only.
:attr:`KafkaBroker.kafka` gives the client settings.
"""

from __future__ import annotations

import asyncio
import base64
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from outboxkit.outbox.kafka_settings import KafkaSettings
from outboxkit.testing.certificates import Certificates, make_certificates
from outboxkit.testing.maven import MavenError, cache_root, copy_dependencies
from outboxkit.testing.processes import kill, terminate

KAFKA_VERSION = "4.1.2"
LOG4J_VERSION = "2.24.3"
READY_TIMEOUT_S = 90.0
Security = Literal["ssl", "mtls", "sasl_ssl"]
SECURITY_MODES: tuple[Security, ...] = ("ssl", "mtls", "sasl_ssl")
SASL_USER = "outboxkit"

_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>dev.outboxkit</groupId><artifactId>kafka-broker</artifactId><version>1</version>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId>
      <version>{kafka}</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId>
      <artifactId>log4j-slf4j-impl</artifactId><version>{log4j}</version></dependency>
  </dependencies>
</project>
"""

_LOG4J2 = """status = warn
appender.file.type = File
appender.file.name = file
appender.file.fileName = {log_file}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = {level}
rootLogger.appenderRef.file.ref = file
"""


class KafkaLauncherError(RuntimeError):
    """The broker could not be fetched or started; the message says why."""


def cache_dir() -> Path:
    """Return the folder holding the broker jars (under ``OUTBOXKIT_CACHE`` or
    ``~/.cache/outboxkit``)."""
    return cache_root() / f"kafka-{KAFKA_VERSION}"


def fetch_jars(quiet: bool = True) -> Path:
    """Fetch the broker jars with ``mvn`` once; return the folder of jars."""
    try:
        return copy_dependencies(
            cache_dir(), _POM.format(kafka=KAFKA_VERSION, log4j=LOG4J_VERSION), quiet=quiet
        )
    except MavenError as error:
        raise KafkaLauncherError(f"cannot fetch the Kafka jars: {error}") from error


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that is free right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def port_is_free(port: int) -> bool:
    """Whether nothing listens on (or holds) ``port`` on 127.0.0.1 right now."""
    with socket.socket() as probe:
        # As a server binds (the broker does): a port whose last connections linger in
        # TIME_WAIT after a stop is free to bind again, and a broker restarted on it must be.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def new_cluster_id() -> str:
    """A random KRaft cluster id (base64 of 16 bytes, as ``kafka-storage random-uuid``)."""
    while True:
        cluster_id = base64.urlsafe_b64encode(os.urandom(16)).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


class KafkaBroker:
    """One KRaft node (broker and controller) on 127.0.0.1; ``start`` and ``stop`` may be
    repeated. Alone it is a single-node cluster; :class:`~outboxkit.testing.kafka_cluster.
    KafkaCluster` makes nodes of one cluster with ``node_id``, ``quorum`` and ``cluster_id``.

    A restart keeps the data directory and the port, as a real broker restart would.
    """

    def __init__(
        self,
        port: int | None = None,
        data_dir: Path | None = None,
        auto_create_topics: bool = True,
        log_level: str = "WARN",
        security: Security | None = None,
        *,
        node_id: int = 1,
        controller_port: int | None = None,
        quorum: str | None = None,
        cluster_id: str | None = None,
        replication: int = 1,
        heap: str = "512m",
        extra_properties: dict[str, str] | None = None,
        jvm_options: tuple[str, ...] = (),
    ) -> None:
        if security is not None and security not in SECURITY_MODES:
            raise ValueError(f"security must be one of {', '.join(SECURITY_MODES)} or None")
        self.port = port or free_port()
        self.controller_port = controller_port or free_port()
        self.node_id = node_id
        # ``controller.quorum.voters``: this node alone unless it is one of a cluster.
        self.quorum = quorum or f"{node_id}@127.0.0.1:{self.controller_port}"
        self.cluster_id = cluster_id or new_cluster_id()
        self.replication = replication
        self.heap = heap
        self.extra_properties = dict(extra_properties or {})
        self.jvm_options = jvm_options
        self.security = security
        self.internal_port = free_port() if security else None
        # A throwaway secret of a throwaway broker: clients need it, so it is shown.
        self.sasl_password = secrets.token_urlsafe(16) if security == "sasl_ssl" else None
        self._certificates: Certificates | None = None
        self.data_dir = data_dir or Path(tempfile.mkdtemp(prefix="outboxkit-kafka-"))
        self.auto_create_topics = auto_create_topics
        self.log_level = log_level
        self._process: subprocess.Popen[bytes] | None = None
        self._formatted = False
        self._frozen = False

    @property
    def bootstrap(self) -> str:
        """The bootstrap address clients use."""
        return f"127.0.0.1:{self.port}"

    @property
    def certificates(self) -> Certificates | None:
        """The CA and certificates of a TLS broker (made on first use), else ``None``."""
        if self.security is not None and self._certificates is None:
            self._certificates = make_certificates(self.data_dir / "tls")
        return self._certificates

    @property
    def kafka(self) -> KafkaSettings:
        """What a client needs to connect: bootstrap, protocol, CA, certificate, SASL user."""
        files = self.certificates
        given: dict[str, Any] = {"bootstrap": self.bootstrap, "security_protocol": "PLAINTEXT"}
        if files is not None:
            given.update(ssl_cafile=files.ca_file, security_protocol="SSL")
        if self.security == "mtls" and files is not None:
            given.update(
                ssl_certfile=files.client_cert,
                ssl_keyfile=files.client_key,
                ssl_key_password=files.client_key_password,
            )
        if self.security == "sasl_ssl":
            given.update(
                security_protocol="SASL_SSL",
                sasl_mechanism="SCRAM-SHA-512",
                sasl_username=SASL_USER,
                sasl_password=self.sasl_password,
            )
        return KafkaSettings(**given)

    @property
    def min_insync(self) -> int:
        """``min.insync.replicas``: 2 when the data has replicas, else 1."""
        return 2 if self.replication > 1 else 1

    @property
    def log_file(self) -> Path:
        """The broker's log file."""
        return self.data_dir / "server.log"

    def _write_config(self) -> Path:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        properties = {
            "process.roles": "broker,controller",
            "node.id": str(self.node_id),
            "controller.quorum.voters": self.quorum,
            "listeners": (
                f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}"
            ),
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "log.dirs": str(self.data_dir / "logs"),
            "num.partitions": "1",
            "auto.create.topics.enable": str(self.auto_create_topics).lower(),
            "default.replication.factor": str(self.replication),
            "min.insync.replicas": str(self.min_insync),
            "offsets.topic.replication.factor": str(self.replication),
            "offsets.topic.num.partitions": "1",
            "transaction.state.log.replication.factor": str(self.replication),
            "transaction.state.log.min.isr": str(self.min_insync),
            "transaction.state.log.num.partitions": "1",
            "share.coordinator.state.topic.replication.factor": str(self.replication),
            "share.coordinator.state.topic.min.isr": str(self.min_insync),
            "group.initial.rebalance.delay.ms": "0",
            "log.cleaner.dedupe.buffer.size": "1048577",
        }
        properties.update(self._security_properties())
        properties.update(self.extra_properties)
        config = self.data_dir / "server.properties"
        config.write_text("".join(f"{k}={v}\n" for k, v in properties.items()))
        (self.data_dir / "log4j2.properties").write_text(
            _LOG4J2.format(log_file=self.log_file, level=self.log_level)
        )
        return config

    def _security_properties(self) -> dict[str, str]:
        files = self.certificates
        if files is None:
            return {}
        protocol = "SASL_SSL" if self.security == "sasl_ssl" else "SSL"
        client = "listener.name.client."
        properties = {
            "listeners": (
                f"CLIENT://127.0.0.1:{self.port},INTERNAL://127.0.0.1:{self.internal_port},"
                f"CONTROLLER://127.0.0.1:{self.controller_port}"
            ),
            "advertised.listeners": (
                f"CLIENT://127.0.0.1:{self.port},INTERNAL://127.0.0.1:{self.internal_port}"
            ),
            "inter.broker.listener.name": "INTERNAL",
            "listener.security.protocol.map": (
                f"CONTROLLER:PLAINTEXT,INTERNAL:PLAINTEXT,CLIENT:{protocol}"
            ),
            f"{client}ssl.keystore.type": "PKCS12",
            f"{client}ssl.keystore.location": str(files.server_keystore),
            f"{client}ssl.keystore.password": files.keystore_password,
            f"{client}ssl.key.password": files.keystore_password,
            f"{client}ssl.truststore.type": "PEM",
            f"{client}ssl.truststore.location": str(files.ca_file),
            f"{client}ssl.client.auth": "required" if self.security == "mtls" else "none",
        }
        if self.security == "sasl_ssl":
            scram = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
            plain = (
                "org.apache.kafka.common.security.plain.PlainLoginModule required "
                f'user_{SASL_USER}="{self.sasl_password}";'
            )
            properties.update(
                {
                    f"{client}sasl.enabled.mechanisms": "SCRAM-SHA-512,SCRAM-SHA-256,PLAIN",
                    f"{client}scram-sha-512.sasl.jaas.config": scram,
                    f"{client}scram-sha-256.sasl.jaas.config": scram,
                    f"{client}plain.sasl.jaas.config": plain,
                }
            )
        return properties

    def _scram_users(self) -> list[str]:
        if self.security != "sasl_ssl":
            return []
        user = f"[name={SASL_USER},password={self.sasl_password}]"
        return [
            argument
            for mechanism in ("SCRAM-SHA-512", "SCRAM-SHA-256")
            for argument in ("--add-scram", f"{mechanism}={user}")
        ]

    def start(self, timeout: float = READY_TIMEOUT_S) -> None:
        """Start the broker and return once it answers a metadata request."""
        self.launch()
        self.wait_ready(timeout)

    def launch(self) -> None:
        """Start the broker's process (formatting its storage the first time) and return at
        once: a node of a cluster answers only once a majority of controllers runs."""
        if self._process is not None:
            raise KafkaLauncherError("broker already running")
        self.format()
        config = self.data_dir / "server.properties"
        stdout = open(self.data_dir / "stdout.log", "ab")  # noqa: SIM115 - lives with the process
        self._process = subprocess.Popen(
            [
                "java",
                "-Xms128m",
                f"-Xmx{self.heap}",
                *self.jvm_options,
                self._log_option,
                "-cp",
                self._classpath,
                "kafka.Kafka",
                str(config),
            ],
            stdout=stdout,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        stdout.close()

    @property
    def _log_option(self) -> str:
        return f"-Dlog4j2.configurationFile={self.data_dir / 'log4j2.properties'}"

    @property
    def _classpath(self) -> str:
        return f"{fetch_jars()}/*"

    def format(self) -> None:
        """Write the configuration and, the first time, format the storage with the cluster
        id (``kafka-storage format``); checks Java and the ports first."""
        if shutil.which("java") is None:
            raise KafkaLauncherError("java is not installed: Kafka needs Java 17")
        if self._process is None:
            for port in (self.port, self.controller_port, self.internal_port):
                if port is not None and not port_is_free(port):
                    raise KafkaLauncherError(f"port {port} on 127.0.0.1 is already in use")
        config = self._write_config()
        if self._formatted:
            return
        result = subprocess.run(
            [
                "java",
                "-XX:TieredStopAtLevel=1",  # a short-lived tool: the quick compiler is enough
                self._log_option,
                "-cp",
                self._classpath,
                "kafka.tools.StorageTool",
                "format",
                "-t",
                self.cluster_id,
                "-c",
                str(config),
                "--ignore-formatted",
                *self._scram_users(),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            raise KafkaLauncherError(f"kafka storage format failed: {result.stderr[-2000:]}")
        self._formatted = True

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> None:
        """Return once the broker answers a metadata request; stop it and raise
        :class:`KafkaLauncherError` if it exits or is not ready within ``timeout``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process is not None and self._process.poll() is not None:
                raise KafkaLauncherError(
                    f"broker exited with {self._process.returncode}; see {self.log_file}"
                )
            if _metadata_ok_blocking(self.kafka) and self.exit_code is None:
                return
            time.sleep(0.3)
        self.stop()
        raise KafkaLauncherError(f"broker not ready after {timeout:.0f}s; see {self.log_file}")

    @property
    def exit_code(self) -> int | None:
        """The broker process's exit code once it has ended, else ``None`` (running, or never
        started)."""
        return None if self._process is None else self._process.poll()

    @property
    def pid(self) -> int | None:
        """The broker process's id while it runs (or is frozen), else ``None``."""
        return self._process.pid if self.running and self._process is not None else None

    @property
    def running(self) -> bool:
        """Whether the broker's process runs (a frozen one too)."""
        return self.exit_code is None and self._process is not None

    @property
    def frozen(self) -> bool:
        """Whether the broker is frozen (SIGSTOP) by :meth:`freeze`."""
        return self._frozen

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the broker with SIGTERM, a clean shutdown (SIGKILL after ``timeout``); the
        data dir stays."""
        self.thaw()  # a frozen process would not act on SIGTERM
        process, self._process = self._process, None
        if process is not None:
            terminate(process, timeout)

    def kill(self) -> None:
        """SIGKILL the broker, as a crash would; the data dir stays."""
        process, self._process = self._process, None
        self._frozen = False
        if process is not None:
            kill(process)

    def freeze(self) -> None:
        """SIGSTOP the broker: its sockets stay open and nothing answers (the hardest case for
        clients), until :meth:`thaw`."""
        if self._process is not None and self.exit_code is None:
            self._process.send_signal(signal.SIGSTOP)
            self._frozen = True

    def thaw(self) -> None:
        """SIGCONT a broker frozen by :meth:`freeze`."""
        if self._frozen and self._process is not None and self.exit_code is None:
            self._process.send_signal(signal.SIGCONT)
        self._frozen = False

    def restart(self) -> None:
        """Stop and start again on the same port with the same data."""
        self.stop()
        self.start()

    def close(self) -> None:
        """Stop the broker and delete its data directory."""
        self.stop()
        shutil.rmtree(self.data_dir, ignore_errors=True)


def _metadata_ok_blocking(kafka: KafkaSettings) -> bool:
    # A thread of its own, so the launcher also works when called from a running event loop.
    answers: list[bool] = []
    probe = threading.Thread(target=lambda: answers.append(asyncio.run(_metadata_ok(kafka))))
    probe.start()
    probe.join()
    return bool(answers and answers[0])


@contextmanager
def broker_from_env(on_start: Callable[[str], None] | None = None) -> Iterator[str]:
    """Yield ``OUTBOXKIT_KAFKA_BOOTSTRAP`` if set, else start a fresh local broker for the block.

    ``on_start`` is called with the bootstrap address once a broker of our own is ready.
    """
    given = os.environ.get("OUTBOXKIT_KAFKA_BOOTSTRAP")
    if given:
        yield given
        return
    broker = KafkaBroker()
    broker.start()
    if on_start is not None:
        on_start(broker.bootstrap)
    try:
        yield broker.bootstrap
    finally:
        broker.close()


async def _metadata_ok(kafka: KafkaSettings) -> bool:
    from aiokafka import AIOKafkaClient

    host, port = kafka.bootstrap.rsplit(":", 1)
    try:  # a plain connect first keeps aiokafka from logging every refused attempt
        with socket.create_connection((host, int(port)), timeout=1):
            pass
    except OSError:
        return False
    client = AIOKafkaClient(**kafka.client_options("outboxkit-launcher"), request_timeout_ms=3000)
    try:
        await client.bootstrap()
        return True
    except Exception:
        return False
    finally:
        await client.close()


async def create_topic(
    kafka: KafkaSettings | str, topic: str, partitions: int = 1, replication: int = 1
) -> None:
    """Create ``topic`` with ``partitions`` partitions (``replication`` copies of each) up
    front, so no consumer waits for it to appear in the metadata. ``kafka``: the broker's
    settings, or the bootstrap address of a PLAINTEXT broker or cluster."""
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    settings = kafka if isinstance(kafka, KafkaSettings) else KafkaSettings(bootstrap=kafka)
    admin = AIOKafkaAdminClient(**settings.client_options("outboxkit-launcher"))
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, partitions, replication)])
    finally:
        await admin.close()
