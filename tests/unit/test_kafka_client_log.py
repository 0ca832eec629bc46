"""librdkafka's own lines go to the ``effectlog.log.kafka.librdkafka`` logger one level down:
never on stderr at the default level, shown at INFO."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest

from effectlog.log.kafka.client_log import ClientLog

# A producer pointed at a port nothing listens on: librdkafka logs "Connection refused" at
# ERROR level, then retries, as it does while a broker restarts.
REFUSED = """
import logging, sys, time
if sys.argv[1] != "default":
    logging.basicConfig(level=sys.argv[1])
from confluent_kafka import Producer
from effectlog.log.kafka.settings import KafkaSettings
from effectlog.log.kafka.producer import producer_config
producer = Producer(producer_config(KafkaSettings.from_url("kafka://127.0.0.1:9?prefix=x")))
producer.produce("x.events", b"v", b"k")
deadline = time.monotonic() + 3
while time.monotonic() < deadline:
    producer.poll(0.1)
producer.purge()
"""


@pytest.mark.parametrize(("level", "expected"), [
    (logging.DEBUG, logging.DEBUG), (logging.INFO, logging.INFO),
    (logging.WARNING, logging.INFO), (logging.ERROR, logging.INFO),
    (logging.CRITICAL, logging.CRITICAL)])
def test_librdkafka_levels_go_one_step_down_to_info(caplog: pytest.LogCaptureFixture,
                                                    level: int, expected: int) -> None:
    with caplog.at_level(logging.DEBUG, logger="effectlog.log.kafka.librdkafka"):
        ClientLog().log(level, "%s [%s] %s", "GETPID", "rdkafka#producer-1", "Coordinator load")
    (record,) = caplog.records
    assert record.levelno == expected and record.name == "effectlog.log.kafka.librdkafka"
    assert record.getMessage() == "GETPID [rdkafka#producer-1] Coordinator load"


def test_a_refused_connection_prints_nothing_at_the_default_level() -> None:
    quiet = subprocess.run([sys.executable, "-c", REFUSED, "default"], capture_output=True,
                           text=True, timeout=60)
    assert quiet.returncode == 0 and quiet.stderr == ""
    told = subprocess.run([sys.executable, "-c", REFUSED, "INFO"], capture_output=True,
                          text=True, timeout=60)
    assert "INFO:effectlog.log.kafka.librdkafka:" in told.stderr
    assert "Connection refused" in told.stderr
