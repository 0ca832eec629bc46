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
            yield broker.bootstrap
    except BrokerError as exc:
        print(f"no Kafka broker for the benchmark: {exc}", file=sys.stderr)
        yield None
