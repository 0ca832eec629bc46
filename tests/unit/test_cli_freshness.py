"""Reads reflect writes: on the SQLite log, `get`, `list` and `stats` (real processes through
the console entry point) catch the projection up first, say how far behind it is where
another process holds it, and `--no-catch-up` reads it as it is."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from effectlog.cli.entry import fast_get_json
from effectlog.cli.freshness import lag, sqlite_log_end
from effectlog.log import open_log
from effectlog.model import State
from effectlog.worker import Worker
from projections.projector import Projector, project
from tests import projector_workload as workload

KEY = "agent:op-1:email.send:mailto:a@example.com"
ENTRY = "import sys; from effectlog.cli.entry import main; sys.argv[0] = 'effectlog'; main()"


def cli(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The installed console entry (fast path included), as a user runs it."""
    env = {**os.environ, "EFFECTLOG_LOG": f"sqlite:///{tmp}/log.db",
           "EFFECTLOG_STATE": str(tmp / "state")}
    return subprocess.run([sys.executable, "-c", ENTRY, *args], capture_output=True, text=True,
                          timeout=120, env=env)


@pytest.fixture
def behind(tmp_path: Path) -> Path:
    """A projection that has CREATED and RESERVED of KEY, and a log that also has DISPATCH."""
    log = open_log(f"sqlite:///{tmp_path}/log.db")
    worker = Worker(log, "w1")
    worker.create("op-1", "email.send", "mailto:a@example.com", {"s": 1})
    worker.reserve(KEY)
    project(log, tmp_path / "state")
    worker.dispatch(KEY)
    log.close()
    return tmp_path


def test_get_json_shows_the_latest_append_without_running_project(behind: Path) -> None:
    done = cli(behind, "get", KEY, "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["state"] == "DISPATCHED"
    assert done.stderr == ""


def test_list_and_stats_catch_up_as_get_does(behind: Path) -> None:
    listed = cli(behind, "list", "--json")
    assert [s["state"] for s in json.loads(listed.stdout)] == ["DISPATCHED"]
    log = open_log(f"sqlite:///{behind}/log.db")
    Worker(log, "w1").record(KEY, State.SUCCEEDED, {"id": 1})
    log.close()
    stats = json.loads(cli(behind, "stats", "--json").stdout)
    assert stats["lag"] == {"0": 0} and stats["states"]["SUCCEEDED"] == 1


def test_no_catch_up_reads_the_projection_as_it_is(behind: Path) -> None:
    for args in (("get", KEY, "--json", "--no-catch-up"), ("get", "--no-catch-up", KEY, "--json")):
        done = cli(behind, *args)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["state"] == "RESERVED"
    stats = json.loads(cli(behind, "stats", "--json", "--no-catch-up").stdout)
    assert stats["lag"] == {"0": 1}
    assert json.loads(cli(behind, "get", KEY, "--json").stdout)["state"] == "DISPATCHED"


def test_fast_path_answers_only_when_the_projection_is_not_behind(behind: Path) -> None:
    argv = ["--log", f"sqlite:///{behind}/log.db", "--state", str(behind / "state"),
            "get", KEY, "--json"]
    assert fast_get_json(argv) is None  # behind: the full CLI catches up first
    assert fast_get_json([*argv, "--no-catch-up"]) == 0
    assert cli(behind, "get", KEY, "--json").returncode == 0  # caught up now
    assert fast_get_json(argv) == 0
    assert fast_get_json(["--log", f"sqlite:///{behind}/elsewhere.db", *argv[2:]]) is None


def test_the_freshness_check_creates_nothing(tmp_path: Path, behind: Path) -> None:
    before = sorted(p.name for p in behind.iterdir())
    assert lag(f"sqlite:///{behind}/log.db", {0: 2}, {}, "the state") == 1
    assert sqlite_log_end(f"sqlite:///{tmp_path}/no/such/log.db") is None
    assert sqlite_log_end("kafka://127.0.0.1:1") is None
    assert sorted(p.name for p in behind.iterdir()) == before  # no -wal, no -shm
    assert not (tmp_path / "no").exists()


def test_a_read_says_how_far_behind_when_another_process_holds_the_projection(
        behind: Path) -> None:
    log = open_log(f"sqlite:///{behind}/log.db")
    Worker(log, "w1").record(KEY, State.SUCCEEDED, {"id": 1})
    with Projector(log, behind / "state"):  # holds the writer lock, projects nothing
        done = cli(behind, "get", KEY, "--json")
        listed = cli(behind, "list", "--keys")
    log.close()
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["state"] == "RESERVED"
    assert done.stderr.count("\n") == 1
    assert "2 event(s) behind the log" in done.stderr and "another process" in done.stderr
    assert listed.stdout == KEY + "\n" and "2 event(s) behind" in listed.stderr


def test_a_read_next_to_a_running_projector_waits_for_it_and_shows_the_append(
        behind: Path) -> None:
    env = {**os.environ, "EFFECTLOG_LOG": f"sqlite:///{behind}/log.db",
           "EFFECTLOG_STATE": str(behind / "state")}
    projector = subprocess.Popen([sys.executable, "-m", "effectlog.cli.main", "project",
                                  "--quiet"], env=env)
    try:
        assert _wait(lambda: cli(behind, "get", KEY, "--json", "--no-catch-up").stdout, 30)
        log = open_log(f"sqlite:///{behind}/log.db")
        Worker(log, "w1").record(KEY, State.SUCCEEDED, {"id": 1})
        log.close()
        done = cli(behind, "get", KEY, "--json")
        assert json.loads(done.stdout)["state"] == "SUCCEEDED" and done.stderr == ""
    finally:
        projector.send_signal(signal.SIGTERM)
        projector.wait(30)


def _wait(predicate: Callable[[], object], within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def test_catch_up_is_bounded_by_the_timeout(tmp_path: Path) -> None:
    log = open_log(f"sqlite:///{tmp_path}/log.db")
    Worker(log, "w1").create("op-1", "email.send", "mailto:a@example.com", {"s": 1})
    project(log, tmp_path / "state")
    items, _ = workload.build(15_000, bad_every=1000)
    workload.write(log, items)
    log.close()
    done = cli(tmp_path, "--timeout", "0.1", "get", KEY, "--json")
    assert done.returncode == 0, done.stderr
    assert "still" in done.stderr and "event(s) behind the log" in done.stderr
    left = int(done.stderr.split("still ")[1].split(" ")[0])
    assert 0 < left <= len(items)  # a loaded machine may apply nothing in 0.1 s
