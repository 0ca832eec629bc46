"""A KRaft cluster of several Apache Kafka nodes on 127.0.0.1, from the same jars as one broker.

Each node is a :class:`~tools.kafka.broker.KafkaBroker` in combined mode (broker and controller
in one JVM) with its own ports and data directory; all are formatted with one cluster id and
list each other as the controller quorum's voters, so any two of three keep a quorum. Kafka's
internal topics (group offsets, transaction state) get three replicas and need two in sync, as
on a production cluster. :class:`KafkaCluster` starts them together, says which node leads a
partition (the fault tests and the soak kill it), and stops them all.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tools.kafka.broker import BrokerError, KafkaBroker, classpath, free_port, run_java

log = logging.getLogger(__name__)

#: A node's heap: three of them share a 2-core, 24 GiB machine with the tests.
NODE_HEAP = os.environ.get("EFFECTLOG_KAFKA_NODE_HEAP", "384m")

#: Settings every node of a cluster adds to the single broker's: the internal topics are
#: replicated like a production cluster's, and a node that stops heartbeating is fenced (its
#: partitions led by others) after ``broker.session.timeout.ms``.
CLUSTER_CONFIG = {
    "offsets.topic.replication.factor": "3",
    "transaction.state.log.replication.factor": "3",
    "transaction.state.log.min.isr": "2",
    "share.coordinator.state.topic.replication.factor": "3",
    "share.coordinator.state.topic.min.isr": "2",
    "default.replication.factor": "3",
    # A broker's requests to the active controller (producer-id blocks, ISR changes) wait
    # this long on a controller that is paused rather than dead, before going to the newly
    # elected one: with the default 30 s, a fresh idempotent producer could get no id for
    # 30 s while a paused node had been the controller (measured; see docs/kafka/cluster.md).
    "controller.socket.timeout.ms": "5000",
}


def _describe(bootstrap: str, timeout: float) -> Any:
    """Cluster metadata (brokers, topics, partitions with leader, replicas and ISR)."""
    from confluent_kafka.admin import AdminClient

    config: dict[str, Any] = {"bootstrap.servers": bootstrap, "logger": log,
                              "socket.connection.setup.timeout.ms": 1000}
    return AdminClient(config).list_topics(timeout=timeout)


class KafkaCluster:
    """``size`` Kafka nodes with ids 1..size, data under ``data_dir/node-<id>``.

    ``ports`` (one ``(port, controller_port)`` per node) keeps a cluster on its addresses
    across restarts; by default free ports are picked.
    """

    def __init__(self, data_dir: str | os.PathLike[str], size: int = 3,
                 ports: list[tuple[int, int]] | None = None, heap: str = NODE_HEAP,
                 overrides: dict[str, str] | None = None) -> None:
        if size < 3:  # the internal topics have three replicas; two voters lose quorum to one
            raise BrokerError(f"a cluster has 3 or more nodes, not {size}")
        self.data_dir = Path(data_dir)
        ports = ports or [(free_port(), free_port()) for _ in range(size)]
        if len(ports) != size:
            raise BrokerError(f"{len(ports)} port pairs for {size} nodes")
        voters = ",".join(f"{n}@127.0.0.1:{c}" for n, (_, c) in enumerate(ports, 1))
        cluster_id = uuid.uuid4().hex[:22]
        self.nodes = {
            n: KafkaBroker(self.data_dir / f"node-{n}", port=port, controller_port=controller,
                           heap=heap, cluster_id=cluster_id,
                           overrides={**CLUSTER_CONFIG, "node.id": str(n),
                                      "controller.quorum.voters": voters, **(overrides or {})})
            for n, (port, controller) in enumerate(ports, 1)}

    @property
    def bootstrap(self) -> str:
        """Every node's ``host:port``, comma-separated (a client needs any one that answers)."""
        return ",".join(node.bootstrap for node in self.nodes.values())

    @property
    def ports(self) -> list[tuple[int, int]]:
        return [(node.port, node.controller_port) for node in self.nodes.values()]

    def start(self, within_s: float = 120.0, *, detach: bool = False) -> str:
        """Format and start every node at once, then wait until all serve; the bootstrap list."""
        classpath()  # fetched once, before the nodes format in parallel
        with ThreadPoolExecutor(len(self.nodes)) as pool:  # formatting is a JVM each
            list(pool.map(lambda node: node.launch(detach=detach), self.nodes.values()))
        self.wait_ready(within_s)
        return self.bootstrap

    def wait_ready(self, within_s: float = 120.0) -> None:
        """Wait until every node is registered and unfenced (listed as a broker)."""
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            for n, node in self.nodes.items():
                if node.process is not None and node.process.poll() is not None:
                    raise BrokerError(f"Kafka node {n} exited with {node.process.returncode}: "
                                      f"{node.output()}")
            if len(self.live_brokers(1.0)) == len(self.nodes):
                return
            time.sleep(0.2)
        self.stop()
        raise BrokerError(f"the Kafka cluster {self.bootstrap} did not have {len(self.nodes)} "
                          f"brokers within {within_s:g}s; see {self.data_dir}/node-*/broker.log")

    def live_brokers(self, timeout: float = 2.0) -> set[int]:
        """Ids of the brokers the cluster's metadata lists now (none when nothing answers)."""
        from confluent_kafka import KafkaException

        try:
            return set(_describe(self.bootstrap, timeout).brokers)
        except KafkaException:
            return set()

    def leaders(self, topic: str, timeout: float = 5.0) -> dict[int, int]:
        """Partition -> id of the node leading it (-1 while it has no leader)."""
        meta = _describe(self.bootstrap, timeout)
        found = meta.topics.get(topic)
        if found is None or found.error is not None:
            raise BrokerError(f"topic {topic} is not in the metadata of {self.bootstrap}")
        return {p: int(m.leader) for p, m in found.partitions.items()}

    def active_controller(self, timeout: float = 60.0) -> int:
        """Id of the node leading the controller quorum now (Kafka's metadata-quorum tool)."""
        result = run_java("org.apache.kafka.tools.MetadataQuorumCommand", "--bootstrap-server",
                          self.bootstrap, "describe", "--status", timeout=timeout)
        found = re.search(r"^LeaderId:\s*(\d+)", result.stdout, re.MULTILINE)
        if found is None:
            raise BrokerError(f"no quorum leader in the metadata-quorum tool's answer: "
                              f"{(result.stdout + result.stderr)[-300:]}")
        return int(found.group(1))

    def coordinator(self, group: str, timeout: float = 5.0) -> int:
        """Id of the node coordinating consumer group ``group`` (its members' heartbeats)."""
        from confluent_kafka.admin import AdminClient

        config: dict[str, Any] = {"bootstrap.servers": self.bootstrap, "logger": log}
        admin = AdminClient(config)
        described = admin.describe_consumer_groups([group], request_timeout=timeout)[group]
        return int(described.result(timeout).coordinator.id)

    def fully_replicated(self, topics: list[str], timeout: float = 5.0) -> bool:
        """True when every partition of ``topics`` has a leader and all its replicas in sync."""
        from confluent_kafka import KafkaException

        try:
            meta = _describe(self.bootstrap, timeout)
        except KafkaException:
            return False
        for name in topics:
            found = meta.topics.get(name)
            if found is None or found.error is not None:
                return False
            for partition in found.partitions.values():
                if partition.leader < 0 or set(partition.isrs) != set(partition.replicas):
                    return False
        return True

    def node(self, node_id: int) -> KafkaBroker:
        return self.nodes[node_id]

    def pids(self) -> list[int]:
        return [n.process.pid for n in self.nodes.values() if n.process is not None]

    def stop(self, within_s: float = 30.0) -> None:
        """SIGTERM every node at once (one by one, the last would wait for a controller
        quorum that is gone), SIGKILL those still running after ``within_s``."""
        running = [n for n in self.nodes.values()
                   if n.process is not None and n.process.poll() is None]
        for node in running:
            node.resume()  # a paused node cannot shut down
            assert node.process is not None
            node.process.terminate()
        deadline = time.monotonic() + within_s
        for node in running:
            assert node.process is not None
            try:
                node.process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                node.kill()


@contextlib.contextmanager
def running_cluster(size: int = 3, data_dir: str | os.PathLike[str] | None = None,
                    **kwargs: Any) -> Iterator[KafkaCluster]:
    """A cluster for the duration of a ``with`` block (a temporary data dir by default)."""
    with contextlib.ExitStack() as stack:
        if data_dir is None:
            data_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="effectlog-kafka-"))
        cluster = KafkaCluster(data_dir, size, **kwargs)
        try:
            cluster.start()
            yield cluster
        finally:
            cluster.stop()
