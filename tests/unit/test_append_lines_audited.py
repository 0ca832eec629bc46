"""``effectlog append`` lines an audit found taken in part, crashing, or accepted yet
unprojectable: each is now refused whole (exit 2, one line), and no record already on a log
stops a projector. Also: a ``dispatch`` accepted later than ``--timeout`` after its append
began is refused on SQLite as through the judge (exit 3)."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from pathlib import Path

import pytest

from effectlog.log import open_log
from effectlog.worker import Worker
from tests.unit.test_cli_input_defects import KEY, OK, USAGE, expect, line, run

pytestmark = pytest.mark.timeout(120)


def dispatched(tmp: Path) -> None:
    done = run(tmp, "append", stdin=line("create", payload=1) + line("reserve") + line("dispatch"))
    assert done.returncode == OK, done.stderr


def record(result_json: str) -> str:
    return line("record", outcome={"status": "succeeded", "result": 0}).replace(
        '"result": 0', f'"result": {result_json}')


@pytest.mark.parametrize(("result_json", "message"), [
    ('"\\ud800"', "outcome.result is not valid Unicode: lone surrogate \\ud800"),
    ('{"\\ud83d": 1}', "outcome.result is not valid Unicode: lone surrogate \\ud83d"),
    ("NaN", "outcome.result is not canonical JSON: Out of range float values"),
    ("[" * 978 + "]" * 978, "line 1: "),  # parsed, or refused by the parser: never a crash
])
def test_a_result_no_reader_could_read_back_is_refused_like_a_payload(
        tmp_path: Path, result_json: str, message: str) -> None:
    dispatched(tmp_path)
    expect(run(tmp_path, "append", stdin=record(result_json)), USAGE, message)
    assert run(tmp_path, "project", "--once").returncode == OK
    shown = run(tmp_path, "get", KEY, "--json")
    assert shown.returncode == OK and json.loads(shown.stdout)["state"] == "DISPATCHED"


def test_a_field_given_twice_is_refused_not_taken_in_part(tmp_path: Path) -> None:
    twice = line("create", payload=1).replace('"transition": "create"',
                                              '"transition": "create", "transition": "reserve"')
    expect(run(tmp_path, "append", stdin=twice), USAGE, "line 1: field 'transition' is given twice")
    assert not (tmp_path / "log.db").exists()


def test_an_integer_too_long_to_read_is_bad_input(tmp_path: Path) -> None:
    huge = line("create", payload=0).replace('"payload": 0', '"payload": ' + "9" * 5000)
    expect(run(tmp_path, "append", stdin=huge), USAGE, "line 1: Exceeds the limit")


def test_a_recorded_result_with_half_an_emoji_is_projected_and_read_back(tmp_path: Path) -> None:
    """Through the Python API a provider's answer cut inside a UTF-16 pair is recorded as it
    came (escaped); the projector used to crash on it, every run."""
    log = open_log(f"sqlite:///{tmp_path}/log.db")
    try:
        with Worker(log, "w1") as worker:
            answer = json.loads('{"subject": "hello \\ud83d"}')
            worker.perform("op-1", "email.send", "mailto:a@example.com", {"n": 1},
                           lambda call: answer)
    finally:
        log.close()
    assert run(tmp_path, "project", "--once").returncode == OK
    shown = run(tmp_path, "get", KEY, "--json")
    assert shown.returncode == OK, shown.stderr
    assert json.loads(shown.stdout)["outcome"]["result"] == {"subject": "hello \ud83d"}


def test_a_dispatch_accepted_later_than_the_timeout_is_refused_on_sqlite(tmp_path: Path) -> None:
    done = run(tmp_path, "append", stdin=line("create", payload=1) + line("reserve"))
    assert done.returncode == OK, done.stderr
    holder = sqlite3.connect(tmp_path / "log.db", isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")  # another writer holds the write lock for 3 s
    release = threading.Timer(3.0, lambda: holder.execute("COMMIT"))
    release.start()
    try:
        began = time.monotonic()
        late = run(tmp_path, "--timeout", "1", "append", stdin=line("dispatch"))
        took = time.monotonic() - began
    finally:
        release.join()
        holder.close()
    assert late.returncode == 3 or took < 1.0, (late.returncode, took, late.stdout[:200])
    assert "DISPATCH" not in late.stdout


def test_the_console_shows_a_result_with_half_an_emoji_escaped() -> None:
    from consumers.console.pages import detail

    shown = detail({"transition": "RECORD", "outcome": {
        "status": "SUCCEEDED", "source": "worker", "result": {"s": "h\u00e9 \ud83d"}}})
    assert shown.encode("utf-8") and '"h\\u00e9 \\ud83d"' in shown
    assert "hé" in detail({"transition": "RECORD", "outcome": {
        "status": "SUCCEEDED", "source": "worker", "result": "hé"}})
