"""A projector process SIGKILLed at random points and restarted ends exactly where a clean
rebuild of the same log ends: same digest over every column family.

Both backends: 52,500 events (12,500 effects x 4, plus 10 samples every 50th effect, 1,750
of them rejected, for every reason); on Kafka spread over the topic's partitions, each with
its own RocksDB and offset.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from effectlog.errors import EffectlogError
from effectlog.log import EVENTS, EventLog, open_log
from projections import open_reader
from projections.projector import ProjectorSettings, project
from projections.rocksdb.digest import projection_digest
from tests import projector_workload as workload

pytestmark = pytest.mark.crash


def projected(state: Path) -> dict[int, int]:
    with open_reader(state) as reader:
        return reader.next_offsets()


def kill_and_restart(url: str, state: Path, total: int, kills: int, seed: int,
                     max_delay: float) -> list[int]:
    """SIGKILL `effectlog project --once` after random delays, ``kills`` times; then let one
    run finish. Returns the number of events applied at each kill."""
    rng = random.Random(seed)
    env = {**os.environ, "EFFECTLOG_LOG": url, "EFFECTLOG_STATE": str(state)}
    argv = [sys.executable, "-m", "effectlog.cli.main", "project", "--once", "--quiet"]
    seen: list[int] = []
    for _ in range(kills):
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        applying(state, seen[-1] if seen else 0, proc)
        time.sleep(rng.uniform(0.0, max_delay))
        helpers = children(proc.pid)  # the decoder process, if it had started
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        assert wait_gone(helpers, 10), f"helper processes outlived the projector: {helpers}"
        seen.append(sum(projected(state).values()))
        if seen[-1] >= total:
            break
    final = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert final.returncode == 0, final.stderr
    return seen


def applying(state: Path, before: int, proc: subprocess.Popen[bytes], within_s: float = 60.0
             ) -> None:
    """Wait until the projector applies past ``before`` (it is mid-projection then), or ends:
    a kill timed from the process start lands after the end on a fast machine."""
    deadline = time.monotonic() + within_s
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            if sum(projected(state).values()) > before:
                return
        except (EffectlogError, OSError):  # nothing projected yet (its directory is being made)
            pass
        time.sleep(0.02)


def children(pid: int) -> list[int]:
    """Live child processes of ``pid`` (from /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(stat.parent.name))
    return found


def wait_gone(pids: list[int], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = []
        for pid in pids:
            try:
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if state != "Z":
                alive.append(pid)
        if not alive:
            return True
        time.sleep(0.05)
    return False


def check_against_clean_rebuild(log: EventLog, state: Path, clean: Path, total: int,
                                expected: dict[str, int]) -> None:
    assert sum(projected(state).values()) == total
    progress = project(log, clean, ProjectorSettings(batch_size=5000))
    assert progress.records == total
    assert projection_digest(state) == projection_digest(clean)
    with open_reader(state) as reader:
        rejected = {k.split(":", 1)[1]: v for k, v in reader.counts().items()
                    if k.startswith("rejected:")}
    assert rejected == expected


def test_killed_sqlite_projector_equals_a_clean_rebuild(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/log.db"
    log = open_log(url)
    items, expected = workload.build(12_500, bad_every=50)
    assert len(items) >= 50_000
    workload.write(log, items)
    seen = kill_and_restart(url, tmp_path / "state", len(items), kills=8, seed=11,
                            max_delay=0.4)
    assert any(0 < n < len(items) for n in seen), f"no kill landed mid-projection: {seen}"
    check_against_clean_rebuild(log, tmp_path / "state", tmp_path / "clean", len(items),
                                dict(expected))


def test_killed_projector_leaves_no_decoder_process_behind(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/log.db"
    items, _ = workload.build(5_000, bad_every=1000)
    workload.write(open_log(url), items)
    env = {**os.environ, "EFFECTLOG_LOG": url, "EFFECTLOG_STATE": str(tmp_path / "state")}
    proc = subprocess.Popen([sys.executable, "-m", "effectlog.cli.main", "project", "--quiet"],
                            env=env)
    deadline = time.monotonic() + 30
    while not (helpers := children(proc.pid)) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert helpers, "the projector never started its decoder process"
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    assert wait_gone(helpers, 10)


@pytest.mark.kafka
def test_killed_kafka_projector_equals_a_clean_rebuild(tmp_path: Path, kafka_url: str) -> None:
    log = open_log(kafka_url)
    items, expected = workload.build(12_500, bad_every=50)
    workload.write(log, items, chunk=2000)
    assert sum(log.end_offsets(EVENTS).values()) == len(items)
    assert log.partitions(EVENTS) > 1
    # each kill comes up to 0.4 s after the projector applied past the last kill's point: a
    # quiet machine projects the 52,500 records in about a second, a loaded one in several
    seen = kill_and_restart(kafka_url, tmp_path / "state", len(items), kills=6, seed=5,
                            max_delay=0.4)
    assert any(0 < n < len(items) for n in seen), f"no kill landed mid-projection: {seen}"
    check_against_clean_rebuild(log, tmp_path / "state", tmp_path / "clean", len(items),
                                dict(expected))
    log.close()
