"""Workers connect at open: the producer, the topic's metadata and ID, the idempotent producer
id; so no first call pays for them, and a fresh broker's "Coordinator load in progress" is
not printed."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import pytest

import effectlog
from effectlog.log import open_log
from effectlog.log.kafka import KafkaLog
from effectlog.worker import Worker
from tests.kafka_broker import private_broker

pytestmark = pytest.mark.kafka

NOBODY = "http://127.0.0.1:9"  # the judge is asked only by perform; opening needs none

FIRST_WRITER = """
import sys
from effectlog.log import open_log
from effectlog.log.kafka import create_topics, KafkaSettings
from effectlog.worker import Worker
create_topics(KafkaSettings.from_url(sys.argv[1]))
log = open_log(sys.argv[1])
Worker(log, "first", server="http://127.0.0.1:9")
print(log.connected, flush=True)
log.close()
"""


def test_a_worker_holds_its_producer_id_once_opened(kafka_url: str) -> None:
    log = open_log(kafka_url)
    assert isinstance(log, KafkaLog) and not log.connected  # open_log itself: no network
    with Worker(log, "w1", server=NOBODY):
        assert log.connected
    log.close()


def test_an_async_worker_connects_when_entered(kafka_url: str) -> None:
    log = open_log(kafka_url)
    assert isinstance(log, KafkaLog)

    async def enter() -> bool:
        async with effectlog.AsyncWorker(log, "w1", server=NOBODY):
            return log.connected

    assert asyncio.run(enter())
    log.close()


def test_a_worker_opened_with_the_broker_gone_leaves_it_to_the_first_call() -> None:
    log = open_log("kafka://127.0.0.1:9?prefix=gone&timeout_s=1")
    assert isinstance(log, KafkaLog)
    began = time.monotonic()
    Worker(log, "w1", server=NOBODY)  # no exception: the first perform reports it
    assert time.monotonic() - began < 5 and not log.connected
    log.close()


def test_the_first_worker_on_a_fresh_broker_prints_nothing() -> None:
    """A broker's first producer-id request meets "Coordinator load in progress"."""
    with private_broker() as broker:
        done = subprocess.run([sys.executable, "-c", FIRST_WRITER,
                               f"kafka://{broker.bootstrap}?prefix=fresh"],
                              capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "True", done.stderr
    assert done.stderr == ""
