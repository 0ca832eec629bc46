"""No silent waits: with the Kafka broker down (a closed port on 127.0.0.1, no broker needed),
every command that needs the log fails within --timeout / EFFECTLOG_TIMEOUT with one line
naming the address and exit 4, creates nothing, and shows a spinner on a terminal."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
import time
from pathlib import Path

import pytest

from effectlog.cli.context import with_timeout
from effectlog.log.kafka import KafkaSettings
from tests.kafka_broker import free_port

APPEND = ('{"operation_id": "op-1", "kind": "email.send", "target": "mailto:a@example.com", '
          '"payload": {}, "transition": "create", "worker_id": "w1"}\n')
KEY = "agent:op-1:email.send:mailto:a@example.com"
COMMANDS = [
    ("append",), ("history", KEY), ("topics", "create"), ("stats",), ("project", "--once"),
    ("rebuild",), ("recover", "--once"), ("approve", KEY, "--decision", "retry", "--by", "a",
                                          "--reason", "b"),
    ("reconcile", "--once", "--provider", "fake:///provider.db"), ("replay",),
    ("serve", "--metrics-port", "0", "--no-recovery"), ("demo", "--operations", "2"),
]


@pytest.fixture(scope="module")
def closed_port() -> int:
    return free_port()  # bound, then closed: connections are refused


@pytest.mark.parametrize("args", COMMANDS, ids=[" ".join(c[:2]) for c in COMMANDS])
def test_every_command_fails_within_the_timeout_naming_the_broker(
        tmp_path: Path, closed_port: int, args: tuple[str, ...]) -> None:
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "effectlog.cli.main", "--timeout", "1",
                           "--log", f"kafka://127.0.0.1:{closed_port}", "--state", "state",
                           *args], input=APPEND, capture_output=True, text=True, timeout=60,
                          cwd=tmp_path)
    elapsed = time.monotonic() - started
    assert done.returncode == 4, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    assert f"127.0.0.1:{closed_port}" in lines[0]
    assert elapsed < 9  # the 1 s timeout, not the default 10 s (plus start-up)
    assert list(tmp_path.iterdir()) == []  # neither state, nor provider file, nor demo files


def test_the_timeout_comes_from_the_environment_too(tmp_path: Path, closed_port: int) -> None:
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "effectlog.cli.main", "--log",
                           f"kafka://127.0.0.1:{closed_port}", "stats"], capture_output=True,
                          text=True, timeout=60, env={**os.environ, "EFFECTLOG_TIMEOUT": "1"})
    assert done.returncode == 4 and time.monotonic() - started < 9, done.stderr


def test_timeout_sets_the_kafka_url_parameter_and_leaves_other_logs_alone() -> None:
    url = with_timeout("kafka://b1:9092,b2:9092?prefix=p&timeout_s=30", 2.5)
    settings = KafkaSettings.from_url(url)
    assert (settings.timeout_s, settings.prefix, settings.bootstrap) == (2.5, "p", "b1:9092,b2:9092")
    assert with_timeout("sqlite:///x.db", 2) == "sqlite:///x.db"


def test_a_wait_for_the_broker_shows_a_spinner_on_a_terminal(tmp_path: Path,
                                                              closed_port: int) -> None:
    leader, follower = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "effectlog.cli.main", "--timeout", "1",
                             "--log", f"kafka://127.0.0.1:{closed_port}", "history", KEY],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=follower,
                            cwd=tmp_path)
    os.close(follower)
    seen = b""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            chunk = os.read(leader, 4096)
        except OSError:
            break
        if not chunk:
            break
        seen += chunk
    os.close(leader)
    assert proc.wait(30) == 4
    text = seen.decode("utf-8", "replace")
    assert f"reaching kafka://127.0.0.1:{closed_port}" in text and "up to 1s" in text
    assert f"error: kafka broker 127.0.0.1:{closed_port} unreachable" in text
