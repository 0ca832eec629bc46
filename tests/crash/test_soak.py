"""Short soaks (`make soak` runs the long ones): workers and `serve` SIGKILLed (and on Kafka
the broker, or on a three-node cluster its partition leaders), recovery until quiet, no
duplicate effect, no lost acknowledged event, and a projection equal to a clean rebuild."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.kafka_broker import _fail_or_skip
from tools.kafka.broker import BrokerError, classpath, java

REPO = Path(__file__).resolve().parents[2]
LAST = re.compile(r"soak: (\d+) operations, (\d+) kills, (\d+) duplicate effects, (\d+) lost "
                  r"acknowledged events; the final projection (equals|DIFFERS from) a clean "
                  r"rebuild")

pytestmark = [pytest.mark.crash, pytest.mark.timeout(300)]


def soak(work: Path, *args: str) -> tuple[str, str]:
    """Run bench/soak.py; (its last stdout line's figures checked, its stderr).

    It runs in a process group of its own: past the timeout the whole group is SIGKILLed,
    its brokers and serve instances with it (killing only the soak left them running).
    """
    proc = subprocess.Popen([sys.executable, str(REPO / "bench" / "soak.py"), *args,
                             "--dir", str(work)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=REPO, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=280)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        raise AssertionError(f"the soak took over 280s: {stderr[-3000:]}") from None
    assert proc.returncode == 0, stderr[-3000:] + stdout[-1000:]
    match = LAST.fullmatch(stdout.strip().splitlines()[-1])
    assert match is not None, stdout
    operations, kills, duplicates, lost, verdict = match.groups()
    assert (duplicates, lost, verdict) == ("0", "0", "equals")
    assert int(kills) > 0
    return operations, stderr


def served(stderr: str) -> dict[str, tuple[int, int]]:
    """Per serve instance, (starts, starts that got to serve) as the soak reported them."""
    found = re.findall(r"soak: (serve\d*) started (\d+) times, served in (\d+)", stderr)
    return {name: (int(starts), int(n)) for name, starts, n in found}


def kills(stderr: str, what: str) -> int:
    """The final count of ``what`` kills the soak reported on stderr."""
    found = re.findall(rf"(\d+) {what} kills", stderr)
    assert found, stderr[-2000:]
    return int(found[-1])


def test_a_short_soak_on_sqlite_loses_nothing_and_duplicates_nothing(tmp_path: Path) -> None:
    operations, stderr = soak(tmp_path / "soak", "--ops", "120", "--workers", "3",
                              "--seed", "11", "--serve-uptime", "1.5-4")
    assert operations == "120"
    assert kills(stderr, "worker") > 0 and kills(stderr, "serve") > 0
    (starts, serving), = served(stderr).values()
    assert starts > kills(stderr, "serve") and 0 < serving <= starts, stderr[-2000:]


@pytest.mark.kafka
def test_a_short_soak_on_kafka_with_broker_restarts_loses_nothing(tmp_path: Path) -> None:
    try:
        java(), classpath()
    except BrokerError as exc:
        _fail_or_skip(f"no Apache Kafka for the soak: {exc}")
    operations, stderr = soak(tmp_path / "soak", "--log", "kafka", "--ops", "70",
                              "--workers", "3", "--seed", "5", "--serve-uptime", "6-10",
                              "--broker-every", "2-5", "--broker-kills", "2",
                              "--fence-after", "2")
    assert operations == "70"
    assert kills(stderr, "worker") > 0 and kills(stderr, "serve") > 0
    assert kills(stderr, "broker") > 0
    instances = served(stderr)
    assert set(instances) == {"serve0", "serve1"}, stderr[-2000:]
    assert all(0 < serving <= starts for starts, serving in instances.values()), instances
    assert "state-1 caught up from its stored offsets: equals the clean rebuild" in stderr


@pytest.mark.kafka
def test_a_short_soak_on_a_three_node_cluster_with_leader_kills_loses_nothing(
        tmp_path: Path) -> None:
    try:
        java(), classpath()
    except BrokerError as exc:
        _fail_or_skip(f"no Apache Kafka for the soak: {exc}")
    # a serve answers about 5 s after a start: with 8-12 s lives each serves most of its life
    operations, stderr = soak(tmp_path / "soak", "--log", "kafka", "--brokers", "3",
                              "--ops", "40", "--workers", "3", "--seed", "5",
                              "--serve-uptime", "8-12", "--broker-every", "3-6",
                              "--broker-kills", "2", "--fence-after", "3")
    assert operations == "40"
    assert kills(stderr, "worker") > 0 and kills(stderr, "serve") > 0
    assert kills(stderr, "leader") > 0
    assert re.search(r"failover \d+\.\d+s median", stderr), stderr[-2000:]
    instances = served(stderr)
    assert all(0 < serving <= starts for starts, serving in instances.values()), instances


@pytest.mark.parametrize("bad", [["--broker-kills", "0"], ["--fence-after", "0.5"],
                                 ["--fence-after", "61"], ["--brokers", "2"]])
def test_soak_settings_out_of_range_are_refused_before_anything_starts(
        tmp_path: Path, bad: list[str]) -> None:
    done = subprocess.run([sys.executable, str(REPO / "bench" / "soak.py"), "--log", "kafka",
                           *bad, "--dir", str(tmp_path / "soak")], capture_output=True,
                          text=True, cwd=REPO, timeout=60)
    assert done.returncode == 2, done.stderr
    assert f"error: {bad[0]} is" in done.stderr.splitlines()[-1]
    assert not (tmp_path / "soak").exists()
