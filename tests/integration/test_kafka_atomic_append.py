"""Multi-event appends on Apache Kafka are all or nothing, even for a writer killed mid-append.

Writer processes append groups of three records of one key (the worker's CREATE + RESERVE +
DISPATCH) and are SIGKILLed at random moments, over and over. A reader that tails the topic
meanwhile never sees part of a group, the final log holds every group whole or not at all,
and Kafka's own ``DumpLogSegments`` shows that every data batch is transactional (what makes it
atomic: a ``read_committed`` reader sees a transaction's records only once it committed).
"""

from __future__ import annotations

import collections
import random
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from effectlog.log import EVENTS, open_log
from effectlog.log.kafka import KafkaSettings, create_topics
from tests.kafka_broker import private_broker
from tools.kafka.broker import run_java

pytestmark = pytest.mark.kafka

#: A writer of groups of three records of one key, printing each acknowledged group. An
#: append that fails goes on to the next group: a writer killed mid-transaction holds the last
#: stable offset of its partition until its transaction times out, so the next writer's
#: append to that partition may be committed yet not visible within ``timeout_s``.
WRITER = """
import sys
from effectlog.errors import BackendUnavailable
from effectlog.log import EVENTS, open_log
log = open_log(sys.argv[1])
wid = sys.argv[2]
for i in range(100000):
    key = f"agent:grp-{wid}-{i}:email.send:mailto:x"
    try:
        log.append_many(EVENTS, [(key, f"{wid}/{i}/{j}".encode()) for j in range(3)])
    except BackendUnavailable as exc:
        print(f"group {i}: {exc}", file=sys.stderr, flush=True)
        continue
    print(i, flush=True)
"""
KILLS = 12
BATCH = re.compile(r"isTransactional: (\w+) isControl: false")


def start_writer(url: str, wid: str, stderr: Path) -> subprocess.Popen[str]:
    with stderr.open("w") as err:
        return subprocess.Popen([sys.executable, "-c", WRITER, url, wid],
                                stdout=subprocess.PIPE, stderr=err, text=True)


def kill_after(proc: subprocess.Popen[str], acks: int, stderr: Path,
               within_s: float = 30.0) -> None:
    """SIGKILL ``proc`` once it has acknowledged ``acks`` groups (mid-way through the next)."""
    assert proc.stdout is not None
    deadline = time.monotonic() + within_s
    seen = 0
    while seen < acks and time.monotonic() < deadline:
        if not proc.stdout.readline():
            break
        seen += 1
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    assert seen == acks, (f"writer acknowledged only {seen} of {acks} groups: "
                          f"{stderr.read_text()[-800:]}")


def groups_in(values: list[tuple[int, bytes]]) -> dict[str, list[int]]:
    """group id -> the offsets of its records, from (offset, value) pairs."""
    found: dict[str, list[int]] = collections.defaultdict(list)
    for offset, value in values:
        wid, i, _ = value.decode().split("/")
        found[f"{wid}/{i}"].append(offset)
    return found


def test_no_reader_ever_sees_part_of_a_group_written_by_a_killed_writer(tmp_path: Path) -> None:
    with private_broker() as broker:
        url = f"kafka://{broker.bootstrap}?prefix=atomic&partitions=3"
        create_topics(KafkaSettings.from_url(url))
        partial: list[str] = []
        reads = [0]
        stop = threading.Event()

        def tail() -> None:  # a reader checking every view it gets of the log
            log = open_log(url)
            try:
                while not stop.is_set():
                    for partition in range(3):
                        records = list(log.scan(EVENTS, partition))
                        reads[0] += 1
                        for group, offsets in groups_in(
                                [(r.offset, r.value) for r in records]).items():
                            if len(offsets) != 3:
                                partial.append(f"{group} at {offsets}")
            finally:
                log.close()

        reader = threading.Thread(target=tail, daemon=True)
        reader.start()
        rng = random.Random(11)
        for n in range(KILLS):
            stderr = tmp_path / f"w{n}.err"
            kill_after(start_writer(url, f"w{n}", stderr), rng.randrange(3, 30), stderr)
        stop.set()
        reader.join(60)
        seen_partial = list(partial)

        log = open_log(url)
        try:
            by_partition = {p: [(r.offset, r.value) for r in log.scan(EVENTS, p)]
                            for p in range(3)}
        finally:
            log.close()
        settings = KafkaSettings.from_url(url)
        for partition, values in by_partition.items():
            groups = groups_in(values)
            assert all(len(o) == 3 and o[2] - o[0] == 2 for o in groups.values()), groups
            files = sorted((broker.data_dir / "logs" / f"{settings.topic(EVENTS)}-{partition}")
                           .glob("*.log"))
            dump = run_java("kafka.tools.DumpLogSegments", "--files",
                            ",".join(str(f) for f in files))
            assert dump.returncode == 0, dump.stderr
            batches = BATCH.findall(dump.stdout)
            assert batches and all(transactional == "true" for transactional in batches)
            assert "isControl: true" in dump.stdout  # the commit markers
        total = sum(len(groups_in(v)) for v in by_partition.values())
        assert total >= KILLS * 3  # every writer got groups through before its kill
        assert reads[0] >= KILLS and not seen_partial, seen_partial[:5]
