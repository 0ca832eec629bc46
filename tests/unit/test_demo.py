"""`effectlog demo` end to end through the CLI: real worker processes, real SIGKILLs."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from effectlog.cli.demo.workload import WorkloadSettings, generate

pytestmark = pytest.mark.timeout(240)


def demo(log_url: str, state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "effectlog.cli.main", "--log", log_url, "--state", str(state),
           "demo", "--json", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=200)


def naive_duplicates_planned(operations: int, seed: int, crash_rate: float) -> int:
    jobs = generate(WorkloadSettings(operations=operations, seed=seed, crash_rate=crash_rate))
    return sum(job.naive_effects() for job in jobs) - len(jobs)


def check(figures: dict[str, Any], operations: int, seed: int, crash_rate: float) -> None:
    ours, naive = figures["effectlog"], figures["naive"]
    assert ours["duplicate_effects"] == 0
    assert naive["duplicate_effects"] == naive_duplicates_planned(operations, seed, crash_rate) > 0
    assert ours["operations"] == naive["operations"] == operations
    # every operation ends recorded or waiting for a person; each record has one effect
    assert ours["unresolved"] == 0 and figures["settled"] is True
    assert ours["succeeded"] + ours["awaiting_approval"] == operations
    assert ours["succeeded"] <= ours["provider_effects"] <= operations
    assert len(figures["awaiting_approval"]) == ours["awaiting_approval"]
    assert naive["provider_effects"] == operations + naive["duplicate_effects"]
    assert ours["worker_kills"] > 0 and naive["worker_kills"] > 0


def test_demo_effectlog_has_no_duplicates_where_naive_retries_do(tmp_path: Path) -> None:
    done = demo(f"sqlite:///{tmp_path}/log.db", tmp_path / "state", "--operations", "60",
                "--workers", "3", "--seed", "10")
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(done.stdout)
    check(figures, 60, 10, 0.1)
    provider = sqlite3.connect(tmp_path / "state.demo" / "provider.db")
    executions = [n for (n,) in provider.execute("SELECT executions FROM effects")]
    assert executions and max(executions) == 1  # at the provider itself: once per key

    again = demo(f"sqlite:///{tmp_path}/log.db", tmp_path / "state", "--operations", "5",
                 "--seed", "1", "--crash-rate", "0")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "starting fresh" in again.stderr
    fresh = json.loads(again.stdout)["effectlog"]
    assert (fresh["operations"], fresh["provider_effects"], fresh["worker_kills"]) == (5, 5, 0)


def test_demo_refuses_to_delete_files_it_did_not_make(tmp_path: Path) -> None:
    (tmp_path / "log.db").write_bytes(b"someone's log")
    done = demo(f"sqlite:///{tmp_path}/log.db", tmp_path / "state")
    assert done.returncode == 2 and "refusing to delete" in done.stderr
    assert (tmp_path / "log.db").read_bytes() == b"someone's log"


@pytest.mark.kafka
def test_demo_on_kafka(kafka_bootstrap: str, tmp_path: Path) -> None:
    done = demo(f"kafka://{kafka_bootstrap}", tmp_path / "state", "--operations", "10",
                "--workers", "2", "--seed", "3", "--crash-rate", "0.15")
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(done.stdout)
    assert figures["log"].startswith(f"kafka://{kafka_bootstrap}?prefix=effects-demo-")
    check(figures, 10, 3, 0.15)


def test_demo_refusal_suggests_locations_of_the_scheme_in_use(tmp_path: Path) -> None:
    from effectlog.cli.demo.run import prepare
    from effectlog.errors import InvalidInput

    sqlite_paths, _ = prepare(f"sqlite:///{tmp_path}/log.db", str(tmp_path / "state"))
    with pytest.raises(InvalidInput) as refused:  # refused before any broker is asked
        prepare("kafka://127.0.0.1:1", str(tmp_path / "state"))
    message = str(refused.value)
    assert "not made by `effectlog demo` on a kafka log" in message
    assert "--log kafka://" in message and "sqlite:" not in message
    assert (sqlite_paths.work_dir / "MADE-BY-EFFECTLOG-DEMO").exists()
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "state").mkdir()
    with pytest.raises(InvalidInput, match="--log sqlite:///"):
        prepare(f"sqlite:///{tmp_path}/other/log.db", str(tmp_path / "other" / "state"))


def test_demo_on_a_kafka_log_defaults_to_its_own_state_and_leaves_the_sqlite_demo_alone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from effectlog.cli.demo.run import prepare

    monkeypatch.chdir(tmp_path)  # the relative demo URL below resolves in here
    prepare("sqlite:///.effectlog/demo/log.db", str(tmp_path / ".effectlog/demo/state"))
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    port = _closed_port()
    done = subprocess.run([sys.executable, "-m", "effectlog.cli.main", "--log",
                           f"kafka://127.0.0.1:{port}", "--timeout", "1", "demo"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 4 and f"127.0.0.1:{port}" in done.stderr  # no broker there
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
    from effectlog.cli.demo_command import DEMO_STATE

    assert DEMO_STATE["kafka"] != DEMO_STATE["sqlite"]
    assert not DEMO_STATE["kafka"].startswith(DEMO_STATE["sqlite"].rsplit("/", 1)[0] + "/")


def _closed_port() -> int:
    from tests.kafka_broker import free_port

    return free_port()  # bound, then closed: nothing listens there


@pytest.mark.kafka
def test_kafka_demo_keeps_its_state_apart_from_the_sqlite_demo(kafka_bootstrap: str,
                                                               tmp_path: Path) -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "effectlog.cli.main", *args, "demo",
                               "--operations", "4", "--workers", "2", "--crash-rate", "0",
                               "--json"], cwd=tmp_path, capture_output=True, text=True,
                              timeout=200)

    sqlite_run = run()
    assert sqlite_run.returncode == 0, sqlite_run.stderr[-3000:]
    sqlite_files = {p: p.stat().st_mtime_ns for p in (tmp_path / ".effectlog/demo").rglob("*")
                    if p.is_file()}
    kafka_run = run("--log", f"kafka://{kafka_bootstrap}")
    assert kafka_run.returncode == 0, kafka_run.stderr[-3000:]
    assert json.loads(kafka_run.stdout)["state"] == str(tmp_path / ".effectlog/demo-kafka/state")
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / ".effectlog/demo").rglob("*")
            if p.is_file()} == sqlite_files


@pytest.mark.kafka
def test_make_demo_kafka_leaves_the_prefix_to_the_demo_which_names_it_once(
        kafka_bootstrap: str) -> None:
    from effectlog.cli.demo.run import _fresh_kafka_prefix
    from effectlog.log.kafka import KafkaSettings
    from effectlog.log.kafka.deletion import delete_topics, matching_topics

    makefile = (Path(__file__).resolve().parents[2] / "Makefile").read_text()
    recipe = makefile[makefile.index("demo-kafka: kafka-up"):].split("\n\n")[0]
    assert "prefix=" not in recipe  # the demo names its fresh topics itself
    settings = KafkaSettings.from_url(_fresh_kafka_prefix(f"kafka://{kafka_bootstrap}"))
    assert settings.prefix.startswith("effects-demo-") and settings.prefix.count("demo") == 1
    delete_topics(settings, matching_topics(settings, settings.prefix))
