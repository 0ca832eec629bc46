"""`effectlog project / rebuild / get / list / stats` through the real console entry point."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from effectlog.cli import read_commands
from effectlog.cli.main import cli
from effectlog.codec import event_codec
from effectlog.log import EVENTS, open_log
from effectlog.machine import advance, new_effect
from effectlog.model import Transition as T
from projections import open_reader
from projections.projector import project
from projections.rocksdb import layout
from projections.rocksdb.digest import projection_digest
from projections.rocksdb.reader import RocksProjectionReader
from tests import projector_workload as workload

KEY = "agent:op1:email.send:mailto:u1@example.com"


def run(tmp_path: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "effectlog.cli.main", *args],
                          capture_output=True, text=True, timeout=timeout, env=env(tmp_path))


def env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "EFFECTLOG_LOG": f"sqlite:///{tmp_path}/log.db",
            "EFFECTLOG_STATE": str(tmp_path / "state")}


@pytest.fixture
def projected(tmp_path: Path) -> Path:
    log = open_log(f"sqlite:///{tmp_path}/log.db")
    items, _ = workload.build(30, bad_every=10)
    workload.write(log, items)
    project(log, tmp_path / "state")
    log.close()
    return tmp_path


def test_get_prints_the_snapshot_as_json(projected: Path) -> None:
    done = run(projected, "get", KEY, "--json")
    assert done.returncode == 0, done.stderr
    with open_reader(projected / "state") as reader:
        assert json.loads(done.stdout) == reader.get_json(KEY)
    human = run(projected, "get", KEY)
    assert human.returncode == 0 and "SUCCEEDED" in human.stdout and "op1" in human.stdout


def test_get_of_an_unknown_key_exits_1(projected: Path, tmp_path: Path) -> None:
    done = run(projected, "get", "agent:nope:email.send:x", "--json")
    assert done.returncode == 1 and "no effect with key" in done.stderr
    empty = run(tmp_path / "elsewhere", "get", KEY)
    assert empty.returncode == 2 and "run `effectlog project`" in empty.stderr
    assert not (tmp_path / "elsewhere").exists()


def test_get_json_imports_neither_fastavro_nor_rich(projected: Path) -> None:
    code = ("import sys; from effectlog.cli.main import main\n"
            f"try:\n    main(['get', {KEY!r}, '--json'])\nexcept SystemExit:\n    pass\n"
            "print('LOADED', 'fastavro' in sys.modules, 'rich' in sys.modules,"
            " 'effectlog.model' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env(projected), timeout=60)
    assert done.stdout.strip().splitlines()[-1] == "LOADED False False False", done.stderr


def test_list_filters_by_state_and_age(projected: Path) -> None:
    done = run(projected, "list", "--state", "succeeded", "--older-than", "0s", "--json")
    assert done.returncode == 0, done.stderr
    listed = json.loads(done.stdout)
    assert len(listed) == 30 and {s["state"] for s in listed} == {"SUCCEEDED"}
    assert [s["occurred_at"] for s in listed] == sorted(s["occurred_at"] for s in listed)
    assert json.loads(run(projected, "list", "--older-than", "1d", "--json").stdout) == []
    assert len(json.loads(run(projected, "list", "--limit", "4", "--json").stdout)) == 4
    human = run(projected, "list", "--state", "RESERVED")
    assert human.returncode == 0 and "agent:bad0" in human.stdout


@pytest.mark.parametrize("args", [("list", "--older-than", "5 minutes"),
                                  ("list", "--older-than", "5x"), ("list", "--state", "DONE"),
                                  ("list", "--limit", "0")])
def test_list_with_bad_arguments_exits_2(projected: Path, args: tuple[str, ...]) -> None:
    done = run(projected, *args)
    assert done.returncode == 2, (done.stdout, done.stderr)


def test_list_is_a_range_scan_over_the_index(projected: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    readers: list[RocksProjectionReader] = []

    def counting_reader(obj: object, families: tuple[str, ...]) -> RocksProjectionReader:
        readers.append(RocksProjectionReader(projected / "state", families=families))
        return readers[-1]

    monkeypatch.setattr(read_commands, "_reader", counting_reader)
    result = CliRunner().invoke(cli, ["--state", str(projected / "state"), "list",
                                      "--state", "RESERVED", "--json", "--no-catch-up"])
    assert result.exit_code == 0, result.output
    listed = json.loads(result.output)
    assert len(listed) == 3  # the three rejected-sample effects, held at RESERVED by w2
    with open_reader(projected / "state") as reader:
        total = sum(reader.counts()[k] for k in reader.counts() if k.startswith("state:"))
    assert readers[0].index_steps == len(listed) < total


def test_stats_reports_states_rejections_and_lag(projected: Path) -> None:
    log = open_log(f"sqlite:///{projected}/log.db")
    extra = new_effect("late", "email.send", "mailto:l@x", {}, "w1")
    log.append(EVENTS, extra.idempotency_key, event_codec().encode(extra.to_record()))
    done = run(projected, "stats", "--json", "--no-catch-up")
    assert done.returncode == 0, done.stderr
    stats = json.loads(done.stdout)
    assert stats["states"]["SUCCEEDED"] == 30 and stats["states"]["RESERVED"] == 3
    assert stats["rejected"]["stale_epoch"] == 3 and stats["rejected"]["undecodable"] == 3
    assert stats["lag"] == {"0": 1} and stats["states"]["CREATED"] == 0
    assert stats["end_offsets"]["0"] == stats["next_offsets"]["0"] + 1
    caught_up = json.loads(run(projected, "stats", "--json").stdout)
    assert caught_up["lag"] == {"0": 0} and caught_up["states"]["CREATED"] == 1
    human = run(projected, "stats")
    assert human.returncode == 0 and "stale_epoch" in human.stdout


def test_stats_exits_4_when_the_log_is_unreachable(projected: Path) -> None:
    blocker = projected / "file"
    blocker.write_text("not a directory")
    done = subprocess.run([sys.executable, "-m", "effectlog.cli.main", "--log",
                           f"sqlite:///{blocker}/log.db", "--state", str(projected / "state"),
                           "stats"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 4, done.stderr


def test_project_once_catches_up_and_reports_progress(tmp_path: Path) -> None:
    log = open_log(f"sqlite:///{tmp_path}/log.db")
    items, _ = workload.build(100, bad_every=25)
    workload.write(log, items)
    done = run(tmp_path, "project", "--once")
    assert done.returncode == 0, done.stderr
    assert f"{len(items)} events behind the log" in done.stderr
    assert f"project: {len(items)} events" in done.stderr and "lag 0" in done.stderr
    project(log, tmp_path / "clean")
    assert projection_digest(tmp_path / "state") == projection_digest(tmp_path / "clean")


def test_project_stops_gracefully_on_sigterm(tmp_path: Path) -> None:
    log = open_log(f"sqlite:///{tmp_path}/log.db")
    items, _ = workload.build(2000, bad_every=100)
    workload.write(log, items)
    proc = subprocess.Popen([sys.executable, "-m", "effectlog.cli.main", "project",
                             "--batch-size", "100"], env=env(tmp_path),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert wait_for(lambda: progress_of(tmp_path) > 0, 30)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "stopped on signal" in err
    with open_reader(tmp_path / "state") as reader:
        stored = reader.next_offsets()[0]
    assert 0 < stored <= len(items)


def test_readers_see_a_running_projector_progress(tmp_path: Path) -> None:
    log = open_log(f"sqlite:///{tmp_path}/log.db")
    proc = subprocess.Popen([sys.executable, "-m", "effectlog.cli.main", "project", "--quiet"],
                            env=env(tmp_path))
    try:
        codec = event_codec()
        for i in range(3):
            create = new_effect(f"live{i}", "email.send", "mailto:x@x", {"i": i}, "w1")
            reserve = advance(create, T.RESERVE, "w1")
            log.append_many(EVENTS, [(e.idempotency_key, codec.encode(e.to_record()))
                                     for e in (create, reserve)])
            key = create.idempotency_key
            assert wait_for(lambda key=key: run(tmp_path, "get", key, "--json").returncode == 0,
                            30)
            shown = json.loads(run(tmp_path, "get", key, "--json").stdout)
            assert shown["state"] == "RESERVED"
            listed = json.loads(run(tmp_path, "list", "--state", "RESERVED", "--json").stdout)
            assert len(listed) == i + 1
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    assert proc.returncode == 0


def test_rebuild_command_swaps_in_a_new_generation(projected: Path) -> None:
    before = layout.current_generation(projected / "state")
    digest = projection_digest(projected / "state")
    done = run(projected, "rebuild")
    assert done.returncode == 0, done.stderr
    after = layout.current_generation(projected / "state")
    assert after is not None and after != before and "rebuild:" in done.stderr
    assert projection_digest(projected / "state") == digest
    assert run(projected, "get", KEY, "--json").returncode == 0


def progress_of(tmp_path: Path) -> int:
    with open_reader(tmp_path / "state") as reader:
        return reader.next_offsets().get(0, 0)


def wait_for(predicate: object, timeout: float) -> bool:
    assert callable(predicate)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False
