"""A group setting the broker refuses stops ``serve`` with one line and exit 2.

librdkafka retries a JoinGroup the broker refuses for ever: a member asking for a session
timeout outside the broker's ``group.min.session.timeout.ms``..``group.max.session.timeout.ms``
(a stock broker refuses anything under 6 s) used to serve nothing, without a word.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from effectlog.log.kafka import KafkaSettings, create_topics
from tools.kafka.broker import free_port

pytestmark = pytest.mark.kafka


def test_a_session_timeout_the_broker_refuses_stops_serve_with_one_line(
        kafka_bootstrap: str, tmp_path: Path) -> None:
    url = f"kafka://{kafka_bootstrap}?prefix=t{uuid.uuid4().hex[:12]}&partitions=2"
    create_topics(KafkaSettings.from_url(url))
    # above the broker's group.max.session.timeout.ms (30 min); the test broker allows 1 s
    done = subprocess.run(
        [sys.executable, "-m", "effectlog.cli.main", "--log", url, "--state",
         str(tmp_path / "state"), "serve", "--http", f"127.0.0.1:{free_port()}",
         "--session-timeout", "40m", "--no-recovery"],
        capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, done.stderr
    assert "refuses a group session timeout of 2400000 ms" in errors[0], errors
    assert "--session-timeout" in errors[0] and "Traceback" not in done.stderr
