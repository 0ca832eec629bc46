"""``effectlog recover --server``: a recovery pass asked of the serve instances, each over the
partitions it serves (``POST /v1/recover``), naming the partitions no pass covered (exit 4).
Here one node on SQLite over real HTTP and the real CLI; a cluster of members on Apache Kafka
in ``tests/integration/test_cluster_recovery_kafka.py``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import urllib3

from consumers.node.node import Node, NodeSettings
from consumers.node.recover_route import merge
from effectlog.log import open_log
from effectlog.model import State
from effectlog.worker import Worker
from tests.recovery_support import stuck

pytestmark = pytest.mark.timeout(120)


def _node(tmp_path: Path, *, recovers: bool) -> Node:
    node = Node(f"sqlite:///{tmp_path}/log.db",
                NodeSettings(state_dir=tmp_path / "state", http_port=0, recovers=recovers,
                             loops=False)).start()
    deadline = time.monotonic() + 30
    while node.gate.serving() != [0]:
        assert time.monotonic() < deadline, "the node did not start serving"
        time.sleep(0.02)
    return node


@pytest.fixture
def keys(tmp_path: Path) -> list[str]:
    with open_log(f"sqlite:///{tmp_path}/log.db") as log:
        worker = Worker(log, "crashed")
        return [stuck(worker, "rs-1", State.DISPATCHED), stuck(worker, "rs-2", State.UNKNOWN)]


def _recover(tmp_path: Path, server: str, *args: str) -> subprocess.CompletedProcess[str]:
    # no projection under --state: the pass must come from the server
    return subprocess.run([sys.executable, "-m", "effectlog.cli.main", "--log",
                           f"sqlite:///{tmp_path}/log.db", "--state", str(tmp_path / "none"),
                           "recover", "--once", "--server", server, *args],
                          capture_output=True, text=True, timeout=60)


@pytest.fixture
def recovering(tmp_path: Path, keys: list[str]) -> Iterator[Node]:
    node = _node(tmp_path, recovers=True)
    yield node
    assert node.stop() == []
    node.close()


def test_a_pass_through_the_server_issues_what_its_partitions_need(
        recovering: Node, keys: list[str], tmp_path: Path) -> None:
    done = _recover(tmp_path, recovering.url, "--stuck-after", "0s", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert sorted(c["idempotency_key"] for c in report["issued"]) == sorted(keys)
    assert report["uncovered"] == {} and report["members"] == {recovering.url: [0]}
    again = _recover(tmp_path, recovering.url, "--stuck-after", "0s")  # the node's own ledger
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines()[-1] == "0 command(s) issued, 2 outstanding, 0 backing off"
    assert not (tmp_path / "none").exists()  # nothing local was created


def test_the_pass_takes_the_deadlines_it_is_given(recovering: Node, keys: list[str],
                                                  tmp_path: Path) -> None:
    done = _recover(tmp_path, recovering.url, "--stuck-after", "1h", "--json")
    assert done.returncode == 0 and json.loads(done.stdout)["issued"] == [], done.stderr
    http = urllib3.PoolManager(retries=False, timeout=10)
    bad = http.request("POST", recovering.url + "/v1/recover", body=b'{"stuck_after_s": -1}')
    assert bad.status == 400 and "non-negative" in json.loads(bad.data)["error"]
    for body in (b'{"stuck_after_s": 5, "max_commands": 1e999}',  # int(inf): OverflowError
                 b'{"stuck_after_s": 5, "max_commands": Infinity}',
                 b'{"stuck_after_s": NaN}'):
        bad = http.request("POST", recovering.url + "/v1/recover", body=body)
        assert bad.status == 400, (body, bad.status, bad.data[:200])
        assert "bad recovery settings" in json.loads(bad.data)["error"] \
            or "non-negative" in json.loads(bad.data)["error"]


def test_a_node_without_recovery_covers_nothing_and_says_so(tmp_path: Path,
                                                            keys: list[str]) -> None:
    node = _node(tmp_path, recovers=False)
    try:
        done = _recover(tmp_path, node.url, "--stuck-after", "0s")
        assert done.returncode == 4, done.stderr
        assert done.stderr.strip().splitlines() == [
            f"error: recovery did not cover partition(s) 0 (its owner {node.url} runs with "
            "--no-recovery)"]
        assert done.stdout.splitlines()[-1] == "0 command(s) issued, 0 outstanding, 0 backing off"
    finally:
        assert node.stop() == []
        node.close()


def test_without_a_projection_on_a_local_log_recover_says_where_to_run(tmp_path: Path,
                                                                        keys: list[str]) -> None:
    done = subprocess.run([sys.executable, "-m", "effectlog.cli.main", "--log",
                           f"sqlite:///{tmp_path}/log.db", "--state", str(tmp_path / "none"),
                           "recover", "--once"], capture_output=True, text=True, timeout=60,
                          env={k: v for k, v in os.environ.items() if k != "EFFECTLOG_SERVER"})
    assert done.returncode == 4 and "run `effectlog project`" in done.stderr, done.stderr


def test_uncovered_partitions_are_named_with_why() -> None:
    def report(url: str, covered: list[int], held: dict[str, str], *, recovers: bool = True,
               error: str | None = None) -> dict[str, object]:
        found: dict[str, object] = {
            "served_by": url, "covered": covered, "held": held, "recovers": recovers,
            "issued": [{"idempotency_key": f"k{p}"} for p in covered], "outstanding": 1,
            "backing_off": 0, "truncated": False}
        if error:
            found["error"] = error
        return found

    merged = merge([report("http://a", [0, 1], {"0": "serving", "1": "serving",
                                                 "2": "restoring"}),
                    report("http://b", [], {"3": "serving"}, recovers=False),
                    report("http://c", [], {"4": "serving"}, error="log unreachable")],
                   ["http://d"], 7, {5: "http://d"})
    assert merged["uncovered"] == {
        "2": "restoring on http://a", "3": "its owner http://b runs with --no-recovery",
        "4": "the pass on http://c failed: log unreachable",
        "5": "its owner http://d did not answer",
        "6": "no member serves it now (the group is rebalancing)"}
    assert merged["members"] == {"http://a": [0, 1], "http://b": [], "http://c": []}
    assert len(merged["issued"]) == 2 and merged["outstanding"] == 3


def test_a_local_projection_behind_the_log_is_named_not_trusted(tmp_path: Path,
                                                                 keys: list[str]) -> None:
    from projections.projector import project

    url = f"sqlite:///{tmp_path}/log.db"
    with open_log(url) as log:
        project(log, tmp_path / "state")
        stuck(Worker(log, "crashed"), "rs-3", State.RESERVED)  # after the projection ran

    def local(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "effectlog.cli.main", "--log", url,
                               "--state", str(tmp_path / "state"), "recover", "--once", *args],
                              capture_output=True, text=True, timeout=60,
                              env={k: v for k, v in os.environ.items()
                                   if k != "EFFECTLOG_SERVER"})

    behind = local("--stuck-after", "0s", "--json")
    assert behind.returncode == 4, behind.stderr
    assert len(json.loads(behind.stdout)["issued"]) == 2  # what it saw, it issued
    assert behind.stderr.strip() == (
        f"error: recovery did not cover partition(s) 0 (2 records behind the log in the "
        f"projection under {tmp_path / 'state'}): `effectlog project --once` first, or "
        "--server URL to ask the serve instances")
    with open_log(url) as log:
        project(log, tmp_path / "state")
    caught_up = local("--stuck-after", "0s", "--json")
    assert caught_up.returncode == 0, caught_up.stderr
    assert [c["idempotency_key"] for c in json.loads(caught_up.stdout)["issued"]] == [
        "agent:rs-3:email.send:mailto:a@example.com"]


def test_without_once_the_passes_go_on_until_sigterm(recovering: Node, keys: list[str],
                                                     tmp_path: Path) -> None:
    import signal

    process = subprocess.Popen(
        [sys.executable, "-m", "effectlog.cli.main", "--log", f"sqlite:///{tmp_path}/log.db",
         "--state", str(tmp_path / "none"), "recover", "--server", recovering.url,
         "--stuck-after", "0s"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        lines = [process.stdout.readline() for _ in keys]  # the first pass's commands
        assert sorted(line.split()[1] for line in lines) == sorted(keys), lines
    finally:
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=30)
    assert process.returncode == 0, err
    assert "a pass every 5s until SIGTERM" in err
