"""`effectlog append` and `effectlog history` through the real console entry point."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

LINE = {"operation_id": "op-1", "kind": "email.send", "target": "mailto:a@example.com",
        "worker_id": "w1"}
KEY = "agent:op-1:email.send:mailto:a@example.com"


def run(tmp_path: Path, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "effectlog.cli.main", "--log", f"sqlite:///{tmp_path}/log.db",
           "--state", str(tmp_path / "state"), *args]
    return subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=60)


def lines(*transitions: dict[str, object]) -> str:
    return "".join(json.dumps({**LINE, **t}) + "\n" for t in transitions)


CYCLE = lines({"transition": "create", "payload": {"s": "hi"}}, {"transition": "reserve"},
              {"transition": "dispatch"},
              {"transition": "record", "outcome": {"status": "succeeded", "result": {"id": 1}}})


def test_append_prints_one_line_per_event_with_position(tmp_path: Path) -> None:
    done = run(tmp_path, "append", stdin=CYCLE)
    assert done.returncode == 0, done.stderr
    out = [json.loads(line) for line in done.stdout.splitlines()]
    assert [o["state"] for o in out] == ["CREATED", "RESERVED", "DISPATCHED", "SUCCEEDED"]
    assert [o["position"]["offset"] for o in out] == [0, 1, 2, 3]
    assert [o["fencing_epoch"] for o in out] == [0, 1, 1, 1]
    assert all(o["idempotency_key"] == KEY for o in out)


def test_repeated_create_with_same_payload_returns_the_original(tmp_path: Path) -> None:
    run(tmp_path, "append", stdin=CYCLE)
    done = run(tmp_path, "append", stdin=lines({"transition": "create", "payload": {"s": "hi"}}))
    assert done.returncode == 0
    out = json.loads(done.stdout)
    assert out["existing"] is True and out["state"] == "SUCCEEDED" and out["position"] is None


@pytest.mark.parametrize(("stdin", "code", "message"), [
    ("{not json\n", 2, "invalid JSON"),
    (lines({"transition": "teleport"}), 2, "unknown transition"),
    (json.dumps({"transition": "create"}) + "\n", 2, "operation_id"),
    (lines({"transition": "create", "fencing_epoch": "one"}), 2, "fencing_epoch"),
    (lines({"transition": "create", "kind": "Bad Kind"}), 2, "invalid kind"),
    (lines({"transition": "create", "target": "a\u0007b"}), 2, "control"),
    (lines({"transition": "dispatch"}), 2, "no sqlite log at"),  # only a create makes a log
])
def test_bad_input_gets_one_line_and_its_exit_code(tmp_path: Path, stdin: str, code: int,
                                                    message: str) -> None:
    done = run(tmp_path, "append", stdin=stdin)
    assert done.returncode == code
    assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_conflicts_exit_3_and_keep_what_was_written(tmp_path: Path) -> None:
    run(tmp_path, "append", stdin=CYCLE)
    mismatch = run(tmp_path, "append", stdin=lines({"transition": "create", "payload": {"s": "x"}}))
    assert mismatch.returncode == 3 and "differs" in mismatch.stderr
    illegal = run(tmp_path, "append", stdin=lines({"transition": "dispatch"}))
    assert illegal.returncode == 3 and "not allowed" in illegal.stderr
    history = run(tmp_path, "history", KEY, "--json")
    assert len(history.stdout.splitlines()) == 4


def test_stale_fencing_epoch_exits_3(tmp_path: Path) -> None:
    run(tmp_path, "append", stdin=lines({"transition": "create", "payload": {}},
                                        {"transition": "reserve"}))
    run(tmp_path, "append", stdin=lines({"transition": "reserve", "worker_id": "w2"}))
    stale = run(tmp_path, "append", stdin=lines({"transition": "dispatch", "fencing_epoch": 1}))
    assert stale.returncode == 3 and "stale" in stale.stderr


def test_lines_before_a_bad_line_stay_appended(tmp_path: Path) -> None:
    stdin = lines({"transition": "create", "payload": {}}, {"transition": "reserve"}) + "oops\n"
    done = run(tmp_path, "append", stdin=stdin)
    assert done.returncode == 2 and len(done.stdout.splitlines()) == 2
    assert len(run(tmp_path, "history", KEY, "--json").stdout.splitlines()) == 2


def test_history_shows_a_table_and_json(tmp_path: Path) -> None:
    run(tmp_path, "append", stdin=CYCLE)
    table = run(tmp_path, "history", KEY)
    assert table.returncode == 0 and "DISPATCHED" in table.stdout and "accepted" in table.stdout
    rows = [json.loads(line) for line in run(tmp_path, "history", KEY, "--json").stdout.splitlines()]
    assert [r["event"]["transition"] for r in rows] == ["CREATE", "RESERVE", "DISPATCH", "RECORD"]
    assert rows[0]["event"]["payload"] == {"s": "hi"}


def test_history_of_unknown_key_exits_1_and_bad_key_exits_2(tmp_path: Path) -> None:
    run(tmp_path, "append", stdin=CYCLE)
    assert run(tmp_path, "history", "agent:none:k:t").returncode == 1
    assert run(tmp_path, "history", "not-a-key").returncode == 2


def test_history_of_a_missing_log_exits_2_and_creates_nothing(tmp_path: Path) -> None:
    done = run(tmp_path, "history", KEY)
    assert done.returncode == 2 and f"no sqlite log at {tmp_path}/log.db" in done.stderr
    assert list(tmp_path.iterdir()) == []


def test_bad_cli_arguments_exit_2(tmp_path: Path) -> None:
    assert run(tmp_path, "history").returncode == 2
    assert run(tmp_path, "no-such-command").returncode == 2


def test_unsupported_log_url_exits_2(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "effectlog.cli.main", "--log", "ftp://x",
                           "history", KEY], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "unsupported log URL" in done.stderr
