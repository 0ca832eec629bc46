"""What people read and copy: whole keys in `list` on a narrow terminal (a real pseudo-terminal),
`list --keys` for pipes, history rows with each event's own detail, ISO-8601 UTC times in
tables (epoch milliseconds in --json), and the demo's approve command for every key."""

from __future__ import annotations

import fcntl
import io
import json
import os
import pty
import re
import shlex
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest
from rich.console import Console

from effectlog.cli.demo.report import RunFigures, print_table
from effectlog.log import open_log
from effectlog.model import State
from effectlog.worker import Worker
from projections.projector import project

ISO = re.compile(r"\b\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z\b")
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
LONG_TARGET = "https://admin.shop.example/orders/" + "a1b2c3d4" * 8 + "#approve"


def env(tmp: Path) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    return {**clean, "EFFECTLOG_LOG": f"sqlite:///{tmp}/log.db",
            "EFFECTLOG_STATE": str(tmp / "state")}


def run(tmp: Path, *args: str, columns: int | None = None) -> subprocess.CompletedProcess[str]:
    wide = {} if columns is None else {"COLUMNS": str(columns)}
    return subprocess.run([sys.executable, "-m", "effectlog.cli.main", *args],
                          capture_output=True, text=True, timeout=60, env={**env(tmp), **wide})


def on_terminal(tmp: Path, columns: int, *args: str) -> str:
    """Run the CLI with stdout on a pseudo-terminal ``columns`` wide; what it wrote there."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
    proc = subprocess.Popen([sys.executable, "-m", "effectlog.cli.main", *args], stdin=follower,
                            stdout=follower, stderr=subprocess.PIPE, env=env(tmp))
    os.close(follower)
    chunks: list[bytes] = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the follower side closed: the process is done
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    assert proc.wait(30) == 0, proc.stderr.read() if proc.stderr else ""
    return ANSI.sub("", b"".join(chunks).decode("utf-8").replace("\r", ""))


@pytest.fixture
def effects(tmp_path: Path) -> list[str]:
    """Three projected effects with long keys (longer than a 60-column terminal)."""
    log = open_log(f"sqlite:///{tmp_path}/log.db")
    worker = Worker(log, "w1")
    keys = []
    for i in range(3):
        created = worker.create(f"op-{i}", "browser.click", f"{LONG_TARGET}{i}", {"i": i})
        worker.reserve(created.idempotency_key)
        keys.append(created.idempotency_key)
    project(log, tmp_path / "state")
    log.close()
    return keys


def test_list_never_cuts_a_key_on_a_narrow_terminal(tmp_path: Path, effects: list[str]) -> None:
    shown = on_terminal(tmp_path, 60, "list")
    assert len(effects[0]) > 60
    for key in effects:
        assert key in shown
    assert "…" not in shown


def test_list_uses_the_terminal_width_when_keys_fit(tmp_path: Path, effects: list[str]) -> None:
    shown = on_terminal(tmp_path, 250, "list")
    rows = [line for line in shown.splitlines() if "RESERVED" in line]
    assert len(rows) == 3 and all(row.rstrip().endswith(key) for row, key in zip(rows, effects, strict=True))


def test_list_keys_prints_one_whole_key_a_line(tmp_path: Path, effects: list[str]) -> None:
    done = run(tmp_path, "list", "--keys")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == effects
    piped = run(tmp_path, "list")  # not a terminal: rich's 80 columns would cut them
    assert all(key in piped.stdout for key in effects)
    assert run(tmp_path, "list", "--keys", "--json").returncode == 2


def test_history_rows_show_their_own_outcome_or_reason(tmp_path: Path) -> None:
    log = open_log(f"sqlite:///{tmp_path}/log.db")
    worker, other = Worker(log, "w1"), Worker(log, "w2")
    key = worker.create("op-1", "payment.charge", "stripe:cus_1", {"cents": 100}).idempotency_key
    worker.reserve(key)
    worker.dispatch(key)
    worker.unknown(key, "provider timed out after 30s")
    worker.await_approval(key, "lookup unavailable")
    Worker(log, "approval:alice").approve(key, "retry", "alice", "bank says no charge")
    other.reserve(key)
    other.dispatch(key)
    other.record(key, State.SUCCEEDED, {"charge": "ch_1"})
    log.close()
    done = run(tmp_path, "history", key, columns=250)
    assert done.returncode == 0, done.stderr
    rows = {line.split("│")[2].strip(): line for line in done.stdout.splitlines()
            if line.count("│") >= 8 and line.split("│")[0].strip().isdigit()}
    assert "provider timed out after 30s" in rows["UNKNOWN"]
    assert "lookup unavailable" in rows["AWAIT_APPROVAL"]
    assert "RETRY by alice: bank says no charge" in rows["APPROVE"]
    assert "SUCCEEDED (worker)" in rows["RECORD"] and "ch_1" in rows["RECORD"]
    assert done.stdout.count("bank says no charge") == 1  # later rows do not repeat it
    assert len(ISO.findall(done.stdout)) == 9
    events = [json.loads(line)["event"] for line in run(tmp_path, "history", key, "--json")
              .stdout.splitlines()]
    assert all(isinstance(e["occurred_at"], int) for e in events)


def test_get_shows_iso_times_in_the_table_and_epoch_ms_in_json(tmp_path: Path,
                                                               effects: list[str]) -> None:
    table = run(tmp_path, "get", effects[0])
    assert table.returncode == 0, table.stderr
    assert len(ISO.findall(table.stdout)) == 3  # created_at, logged_at, occurred_at
    shown = json.loads(run(tmp_path, "get", effects[0], "--json").stdout)
    assert isinstance(shown["created_at"], int) and isinstance(shown["occurred_at"], int)
    assert isinstance(shown["logged_at"], int)


def test_demo_prints_the_approve_command_for_every_effect_awaiting_a_decision() -> None:
    figures = RunFigures(operations=3, deliveries=3, worker_kills=0, provider_calls=3,
                         provider_effects=3, duplicate_effects=0, succeeded=1,
                         awaiting_approval=2)
    awaiting = ["agent:a1:payment.charge:stripe:cus_1", "agent:a2:browser.click:https://x/o#1"]
    out = io.StringIO()
    print_table(Console(file=out, width=60), figures, figures, awaiting,
                "effectlog --log sqlite:///d/log.db --state d/state")
    lines = [line for line in out.getvalue().splitlines() if " approve " in line]
    assert len(lines) == 2
    for key, line in zip(awaiting, lines, strict=True):
        assert shlex.split(line) == ["effectlog", "--log", "sqlite:///d/log.db", "--state",
                                     "d/state", "approve", key, "--decision", "abandon", "--by",
                                     "YOU", "--reason", "WHY"]


def test_a_cut_list_ends_with_how_many_more_and_the_cursor_to_page_on(
        tmp_path: Path, effects: list[str]) -> None:
    cut = run(tmp_path, "list", "--limit", "1")
    assert cut.returncode == 0 and effects[0] in cut.stdout and effects[1] not in cut.stdout
    *_, last = cut.stderr.splitlines()
    assert last.startswith("2 more — --limit N (up to 10,000) or --after "), cut.stderr
    cursor = last.split("--after ")[1].split()[0]
    rest = run(tmp_path, "list", "--keys", "--limit", "1", "--after", cursor)
    assert rest.stdout.splitlines() == [effects[1]]
    assert rest.stderr.splitlines()[-1].startswith("more — ")  # after a cursor: not counted
    whole = run(tmp_path, "list", "--keys", "--limit", "3")
    assert whole.stdout.splitlines() == effects and "more" not in whole.stderr
    assert run(tmp_path, "list", "--after", "nonsense").returncode == 2
