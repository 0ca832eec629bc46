"""``make kafka-down`` (``python -m tools.kafka down``) names and stops the ``effectlog serve``
processes still attached to the broker before stopping it; topics go with ``effectlog
topics delete``."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from effectlog.log.kafka import KafkaSettings, create_topics
from tests.cluster_support import Serve, wait_until

pytestmark = pytest.mark.kafka
ROOT = Path(__file__).resolve().parents[2]


def _tools(home: Path, action: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "EFFECTLOG_KAFKA_HOME": str(home)}
    env.pop("KAFKA_PORT", None)
    return subprocess.run([sys.executable, "-m", "tools.kafka", action], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=180)


def _cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "effectlog.cli.main", *args], input=stdin,
                          capture_output=True, text=True, timeout=60)


def test_kafka_down_stops_the_serve_processes_still_attached(tmp_path: Path) -> None:
    home = tmp_path / "kafka"
    up = _tools(home, "up")
    if up.returncode != 0:
        pytest.fail(f"tools.kafka up failed: {up.stdout}{up.stderr}"[-2000:])
    bootstrap = (home / "bootstrap").read_text().strip()
    url = f"kafka://{bootstrap}?prefix=attached&partitions=1"
    serve = None
    try:
        create_topics(KafkaSettings.from_url(url))
        serve = Serve(tmp_path, "a", url, None)
        wait_until(lambda: serve is not None and serve.serving() == [0], 90, "serve did not serve")
        down = _tools(home, "down")
        assert down.returncode == 0, down.stderr
        pid = serve.process.pid
        assert f"stopping effectlog serve (pid {pid}), still attached:" in down.stdout
        assert serve.process.wait(5) == 0  # stopped by the SIGTERM, before the broker
        assert down.stdout.rstrip().splitlines()[-1].startswith("Apache Kafka stopped")
    finally:
        if serve is not None:
            serve.stop()
        _tools(home, "down")


def test_topics_delete_asks_then_deletes_every_log_under_the_prefix(kafka_bootstrap: str) -> None:
    prefix = f"del{uuid.uuid4().hex[:8]}-"
    for name in ("a", "b"):
        create_topics(KafkaSettings.from_url(f"kafka://{kafka_bootstrap}?prefix={prefix}{name}"))
    log = ["--log", f"kafka://{kafka_bootstrap}"]
    asked = _cli(*log, "topics", "delete", "--prefix", prefix, stdin="")
    assert asked.returncode == 2 and "pass --yes" in asked.stderr  # no terminal to ask on
    names = [f"{prefix}{n}.{t}" for n in ("a", "b") for t in ("commands", "events", "state")]
    assert asked.stdout.splitlines() == names
    deleted = _cli(*log, "topics", "delete", "--prefix", prefix, "--yes")
    assert deleted.returncode == 0, deleted.stderr
    assert deleted.stdout.splitlines() == [*names, "deleted 6 topic(s)"]
    again = _cli(*log, "topics", "delete", "--prefix", prefix, "--yes")
    assert again.returncode == 1 and "no effectlog topics with prefix" in again.stderr
    sqlite = _cli("--log", "sqlite:///x.db", "topics", "delete", "--prefix", "x", "--yes")
    assert sqlite.returncode == 2
