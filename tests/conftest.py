"""Shared fixtures. Each owner keeps its fixtures in its own delimited section."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from effectlog.log.kafka import KafkaLog
    from tests.kafka_broker import KafkaBroker, KafkaCluster

# ---- Kafka broker fixtures (tests/kafka_broker.py) ---------------------------------------


#: The session broker this process started (not one given by EFFECTLOG_TEST_KAFKA), once up.
_OWN_BROKER: list[str] = []


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    """``host:port`` of a Kafka-protocol broker shared by the whole session."""
    from tests.kafka_broker import kafka_bootstrap as start_broker

    with start_broker() as bootstrap:
        if not os.environ.get("EFFECTLOG_TEST_KAFKA"):
            _OWN_BROKER.append(bootstrap)
        yield bootstrap


@pytest.fixture(scope="module", autouse=True)
def _session_broker_emptied_after_each_file() -> Iterator[None]:
    """The session broker keeps no topics from one test file to the next: a broker holding
    the few thousand compacted partitions a session creates spends over half a core idle on
    them (log cleaner and housekeeping), measured at 60 % for 1,800 partitions."""
    yield
    if _OWN_BROKER:
        from tests.kafka_broker import remove_topics

        remove_topics(_OWN_BROKER[0])


@pytest.fixture
def kafka_url(kafka_bootstrap: str) -> str:
    """A ``kafka://`` URL with a prefix of its own, its topics created, so tests share no data."""
    from effectlog.log.kafka import KafkaSettings, create_topics

    url = f"kafka://{kafka_bootstrap}?prefix=t{uuid.uuid4().hex[:12]}"
    create_topics(KafkaSettings.from_url(url))
    return url


@pytest.fixture
def kafka_log(kafka_url: str) -> Iterator[KafkaLog]:
    """A Kafka log on ``kafka_url``, closed after the test."""
    from effectlog.log.kafka import KafkaLog

    log = KafkaLog.from_url(kafka_url)
    yield log
    log.close()


@pytest.fixture
def writer(kafka_url: str) -> Iterator[KafkaLog]:
    """Another writer of ``kafka_log``'s topics, as another process would be."""
    from effectlog.log.kafka import KafkaLog

    log = KafkaLog.from_url(kafka_url)
    yield log
    log.close()


# ---- end of Kafka broker fixtures -------------------------------------------------------

# ---- Broker fault fixtures (tests/broker_faults.py) --------------------------------------


@pytest.fixture(scope="session")
def fault_broker() -> Iterator[KafkaBroker]:
    """An Apache Kafka of the fault tests' own, which they pause, kill and restart (each
    test leaves it running); started once, as a JVM start costs seconds. Its controller
    forgets a killed broker's registration after 2 s (default 9 s), so a restart serves
    again within about 4 s instead of 13."""
    from tests.kafka_broker import private_broker

    with private_broker({"broker.session.timeout.ms": "2000",
                         "broker.heartbeat.interval.ms": "500"}) as broker:
        yield broker


# ---- end of broker fault fixtures --------------------------------------------------------

# ---- What the machine still lacks (tests/system_needs.py) --------------------------------


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """One line naming the system packages whose tests skipped for want of them."""
    from tests.system_needs import missing_line

    line = missing_line()
    if line is not None:
        terminalreporter.write_line(line, yellow=True)


# ---- end of what the machine still lacks -------------------------------------------------

# ---- Cluster fixtures (tests/cluster_faults.py) ------------------------------------------


@pytest.fixture(scope="session")
def kafka_cluster() -> Iterator[KafkaCluster]:
    """A KRaft cluster of three Apache Kafka nodes of the session's own, whose nodes the
    cluster tests kill, pause and restart (each test leaves all three running and in sync).
    The controller fences a node that stopped heartbeating after 3 s (default 9 s), so a
    partition it led gets a new leader within about 4 s."""
    from tests.kafka_broker import private_cluster

    with private_cluster(3, {"broker.session.timeout.ms": "3000",
                             "broker.heartbeat.interval.ms": "500"}) as cluster:
        yield cluster


# ---- end of cluster fixtures --------------------------------------------------------------
