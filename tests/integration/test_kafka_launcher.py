"""``python -m tools.kafka`` (``make kafka-up BROKERS=3`` / ``make kafka-down``): a cluster of
three nodes started in the background, its bootstrap list printed last and written where one
broker's address goes, every node stopped by ``down``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.kafka_broker import _fail_or_skip
from tools.kafka.broker import BrokerError, answers_metadata, classpath, java

REPO = Path(__file__).resolve().parents[2]


def launcher(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "EFFECTLOG_KAFKA_HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "tools.kafka", *args], capture_output=True,
                          text=True, timeout=180, cwd=REPO, env=env)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except OSError:
        return False


def test_two_nodes_are_refused_with_one_line(tmp_path: Path) -> None:
    done = launcher(tmp_path, "up", "--brokers", "2")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines()[-1].endswith("--brokers is 1 or a cluster of 3 or more, not 2")
    assert not (tmp_path / "pid").exists()


@pytest.mark.kafka
@pytest.mark.timeout(240)
def test_up_with_three_brokers_starts_a_cluster_and_down_stops_every_node(tmp_path: Path) -> None:
    try:
        java(), classpath()
    except BrokerError as exc:
        _fail_or_skip(f"no Apache Kafka for the launcher: {exc}")
    home = tmp_path / "kafka"
    pids: list[int] = []
    try:
        up = launcher(home, "up", "--brokers", "3")
        assert up.returncode == 0, up.stdout + up.stderr
        pids = [int(p) for p in (home / "pid").read_text().split()]
        last = up.stdout.strip().splitlines()[-1]
        bootstrap = (home / "bootstrap").read_text().strip()
        assert last == f"KAFKA_BOOTSTRAP={bootstrap}" and len(bootstrap.split(",")) == 3
        assert all(a.startswith("127.0.0.1:") for a in bootstrap.split(","))
        assert len(pids) == 3 and all(_alive(p) for p in pids)
        assert answers_metadata(bootstrap, 5.0)
        again = launcher(home, "up")  # one broker asked while three run
        assert again.returncode == 3 and "make kafka-down first" in again.stderr
        assert launcher(home, "status").returncode == 0
    finally:
        down = launcher(home, "down")
        for pid in pids:  # stop what the launcher left, whatever failed above
            if _alive(pid):
                os.kill(pid, 9)
    assert down.returncode == 0, down.stderr
    assert not any(_alive(p) for p in pids)
    assert launcher(home, "status").returncode == 1
