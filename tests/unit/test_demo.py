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
