"""Shared fixtures. Each owner keeps its fixtures in its own delimited section."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import pytest

if TYPE_CHECKING:
    from effectlog.log.kafka import KafkaLog
    from tests.kafka_broker import KafkaBroker, KafkaCluster

T = TypeVar("T")

# ---- Shared servers, stopped once no next test uses them ---------------------------------


class Shared(Generic[T]):
    """A server (a broker, a cluster) the tests using fixture ``name`` share: started by the
    first of them, and stopped once neither the next test of this process nor a later one
    of the same file uses it (an idle cluster of three costs a fifth of a core; a later user
    starts it again). A file's tests run in one process, in order (``--dist loadfile``)."""

    def __init__(self, name: str, start: Callable[[], contextlib.AbstractContextManager[T]]
                 ) -> None:
        self.name = name
        self._start = start
        self._running: tuple[contextlib.ExitStack, T] | None = None
        SHARED.append(self)

    def get(self) -> T:
        if self._running is None:
            stack = contextlib.ExitStack()
            value = stack.enter_context(self._start())
            self._running = (stack, value)
        return self._running[1]

    def release(self) -> None:
        if self._running is not None:
            stack, self._running = self._running[0], None
            stack.close()


SHARED: list[Shared[Any]] = []


def _uses(item: pytest.Item | None, name: str) -> bool:
    return item is not None and name in getattr(item, "fixturenames", ())


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    items = item.session.items
    later = items[items.index(item) + 1:] if item in items else []
    same_file = [i for i in later if i.path == item.path]
    for shared in SHARED:
        if _uses(item, shared.name) and not _uses(nextitem, shared.name) \
                and not any(_uses(i, shared.name) for i in same_file):
            shared.release()


def pytest_sessionfinish(session: pytest.Session) -> None:
    for shared in SHARED:
        shared.release()


# ---- end of shared servers ----------------------------------------------------------------

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


def _fault_broker() -> contextlib.AbstractContextManager[KafkaBroker]:
    from tests.kafka_broker import private_broker

    return private_broker({"broker.session.timeout.ms": "2000",
                           "broker.heartbeat.interval.ms": "500"})


_FAULT_BROKER = Shared("fault_broker", _fault_broker)


@pytest.fixture
def fault_broker() -> KafkaBroker:
    """An Apache Kafka of the fault tests' own, which they pause, kill and restart (each
    test leaves it running); started once for consecutive tests, as a JVM start costs
    seconds. Its controller forgets a killed broker's registration after 2 s (default 9 s),
    so a restart serves again within about 4 s instead of 13."""
    return _FAULT_BROKER.get()


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


def _cluster() -> contextlib.AbstractContextManager[KafkaCluster]:
    from tests.kafka_broker import private_cluster

    return private_cluster(3, {"broker.session.timeout.ms": "3000",
                               "broker.heartbeat.interval.ms": "500"})


_CLUSTER = Shared("kafka_cluster", _cluster)


@pytest.fixture
def kafka_cluster() -> KafkaCluster:
    """A KRaft cluster of three Apache Kafka nodes of the tests' own, whose nodes the
    cluster tests kill, pause and restart (each test leaves all three running and in sync);
    started once for consecutive tests. The controller fences a node that stopped
    heartbeating after 3 s (default 9 s), so a partition it led gets a new leader within
    about 4 s."""
    return _CLUSTER.get()


# ---- end of cluster fixtures --------------------------------------------------------------
