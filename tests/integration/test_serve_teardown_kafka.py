"""Teardown on Kafka: ``serve`` exits within 3 s of SIGTERM with its broker gone, with no
asyncio warning, even with a request waiting."""

from __future__ import annotations

import contextlib
import signal
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from effectlog.log.kafka import KafkaSettings, create_topics
from tests.cluster_support import Serve, wait_until
from tests.kafka_broker import private_broker

pytestmark = pytest.mark.kafka


def _wait_for_offset(url: str) -> None:
    """A request that waits (up to 30 s) for an offset the partition never reaches."""
    with contextlib.suppress(urllib.error.URLError, OSError):
        urllib.request.urlopen(f"{url}/v1/effects/agent:x:y:z?min_offset=999999&timeout_ms=30000",
                               timeout=40).read()


def test_sigterm_with_the_broker_gone_exits_within_3s_without_warnings(tmp_path: Path) -> None:
    with private_broker() as broker:
        url = f"kafka://{broker.bootstrap}?prefix=down&partitions=2"
        create_topics(KafkaSettings.from_url(url))
        serve = Serve(tmp_path, "a", url, None)
        try:
            wait_until(lambda: serve.serving() == [0, 1], 90, "serve did not serve")
            waiting = threading.Thread(target=_wait_for_offset, args=(serve.url,), daemon=True)
            waiting.start()
            broker.kill()
            # once serve notices, its loops are blocked in calls to the broker
            wait_until(lambda: "log_error" in (serve.health() or {}), 30,
                       "serve did not notice the broker was gone")
            began = time.monotonic()
            serve.process.send_signal(signal.SIGTERM)
            code = serve.process.wait(30)
            took = time.monotonic() - began
        finally:
            err = serve.stop()
    assert code == 0, err[-2000:]
    assert took < 3.0, f"serve took {took:.1f}s to exit: {err[-2000:]}"
    for noise in ("Task was destroyed", "Traceback", "Exception ignored", "was never awaited"):
        assert noise not in err, err[-3000:]
    assert err.rstrip().endswith("effectlog serve: stopped")
