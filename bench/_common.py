"""Helpers shared by the benchmark scripts: timing, percentiles, a broker for Kafka runs."""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def timed(fn: Callable[[], object]) -> float:
    """Seconds one call of ``fn`` takes."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def threaded(threads: int, fn: Callable[[int], object]) -> float:
    """Seconds for ``threads`` threads each running ``fn(thread_number)`` to finish."""
    pool = [threading.Thread(target=fn, args=(t,)) for t in range(threads)]
    start = time.perf_counter()
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return time.perf_counter() - start


def percentile(samples: list[float], pct: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(pct / 100 * (len(ordered) - 1)))]


def median(samples: list[float]) -> float:
    return statistics.median(samples)


_BROKER_PIDS: dict[str, int] = {}


def broker_pid(bootstrap: str) -> int | None:
    """The broker process at ``bootstrap`` when this machine can tell: one ``kafka_bootstrap``
    started, or the one ``make kafka-up`` runs; else None."""
    if bootstrap in _BROKER_PIDS:
        return _BROKER_PIDS[bootstrap]
    home = ROOT / ".effectlog" / "kafka"
    try:
        if (home / "bootstrap").read_text().strip() == bootstrap:
            return int((home / "pid").read_text())
    except (OSError, ValueError):
        pass
    return None


def cpu_seconds(pid: int | None) -> float:
    """User plus system CPU seconds of process ``pid`` so far (0 when unknown or gone)."""
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def kafka_bootstrap() -> Iterator[str | None]:
    """EFFECTLOG_BENCH_KAFKA (or EFFECTLOG_TEST_KAFKA), else a private Apache Kafka started from
    the Maven jars (tools/kafka), else None (the Kafka part is skipped)."""
    configured = os.environ.get("EFFECTLOG_BENCH_KAFKA") or os.environ.get("EFFECTLOG_TEST_KAFKA")
    if configured:
        yield configured
        return
    from tools.kafka.broker import BrokerError, running_broker

    try:
        with running_broker() as broker:
            if broker.process is not None:
                _BROKER_PIDS[broker.bootstrap] = broker.process.pid
            yield broker.bootstrap
    except BrokerError as exc:
        print(f"no Kafka broker for the benchmark: {exc}", file=sys.stderr)
        yield None


@contextlib.contextmanager
def run_topics(url: str) -> Iterator[None]:
    """Create the topics of ``url`` (a prefix of this run's own, the changelog ``<prefix>.state``
    included) and delete them afterwards, so a shared broker does not pile up benchmark topics:
    its log cleaner scans every compacted partition it holds, and a broker holding a thousand of
    them spends a good share of a core on that alone, which the next run would measure."""
    from confluent_kafka.admin import AdminClient

    from effectlog.log.kafka import KafkaSettings, create_topics
    from effectlog.log.kafka.settings import KAFKA_TOPICS

    settings = KafkaSettings.from_url(url)
    create_topics(settings)
    try:
        yield
    finally:
        admin = AdminClient(settings.client_config())
        for future in admin.delete_topics([settings.topic(t) for t in KAFKA_TOPICS]).values():
            try:
                future.result(30)
            except Exception as exc:  # reported, not fatal: the figures are already taken
                print(f"could not delete a benchmark topic: {exc}", file=sys.stderr)
