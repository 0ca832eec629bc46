"""Bad bytes never crash a process: garbage and wrong-schema records in the log (SQLite and
memory), rows another tool wrote with the wrong types, and corrupt or truncated files
(log, projection, bookkeeping, provider) give counted rejections or one line and exit 4."""

from __future__ import annotations

import json
import random
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from consumers.commands import ReconciliationCommand
from effectlog.audit import Replay, ReplayFilter
from effectlog.codec import event_codec
from effectlog.judge import CannotJudge
from effectlog.log import EVENTS, EventLog, open_log
from effectlog.machine import new_effect
from effectlog.model import State
from effectlog.view import LogView
from effectlog.worker import Worker
from projections import open_reader
from projections.projector import project
from projections.rocksdb import layout
from tests.recovery_support import stuck

EFFECTLOG = Path(sys.executable).with_name("effectlog")
KIND, TARGET = "email.send", "mailto:a@example.com"
KEY = f"agent:op-1:{KIND}:{TARGET}"


def good() -> bytes:
    return event_codec().encode(new_effect("op-1", KIND, TARGET, {"a": 1}, "w1").to_record())


def wrong_schema() -> bytes:
    """A valid single-object Avro record of another schema (a command) on the events topic."""
    event = new_effect("op-1", KIND, TARGET, {"a": 1}, "w1")
    return ReconciliationCommand.for_event(event, 1, "r").encode()


def forged() -> bytes:
    """The event schema, but an event whose key does not bind its operation, kind and target."""
    event = replace(new_effect("op-1", KIND, TARGET, {"a": 1}, "w1"), operation_id="op-9")
    return event_codec().encode(event.to_record())


GARBAGE = [b"", b"\x00" * 7, b"\xc3\x01", good()[:-4], b"\x89PNG", forged(),
           random.Random(7).randbytes(300)]
#: Single-object Avro records of a writer schema the event codec does not know: another
#: release may have written them, so a worker's fold cannot judge a key that holds one.
UNKNOWN_SCHEMA = [b"\xc3\x01" + b"\xff" * 30, wrong_schema()]


@pytest.fixture(params=["sqlite", "memory"])
def log(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[EventLog]:
    opened = open_log(f"sqlite:///{tmp_path}/log.db" if request.param == "sqlite" else "memory://")
    yield opened
    opened.close()


def cli(tmp: Path, *args: str, log: str | None = None,
        stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(EFFECTLOG), "--log", log or f"sqlite:///{tmp}/log.db", "--state",
                           str(tmp / "state"), *args], capture_output=True, text=True,
                          timeout=60, input=stdin, cwd=tmp)


def one_error_line(done: subprocess.CompletedProcess[str], code: int) -> None:
    assert done.returncode == code, done.stderr
    assert "Traceback" not in done.stderr
    assert [line for line in done.stderr.splitlines() if line.startswith("error:")] \
        == done.stderr.splitlines()[-1:]


# -- records ----------------------------------------------------------------------------------

def test_garbage_records_are_counted_kept_and_passed_by_every_reader(log: EventLog,
                                                                     tmp_path: Path) -> None:
    worker = Worker(log, "w1")
    worker.create("op-1", KIND, TARGET, {"a": 1})
    for data in GARBAGE:
        log.append(EVENTS, KEY, data)
    worker.reserve(KEY)
    worker.dispatch(KEY)
    assert LogView(log).current(KEY).state is State.DISPATCHED  # type: ignore[union-attr]
    other = f"agent:op-2:{KIND}:{TARGET}"
    worker.create("op-2", KIND, TARGET, {"a": 2})
    for data in UNKNOWN_SCHEMA:
        log.append(EVENTS, other, data)
    with pytest.raises(CannotJudge, match="written by another release"):
        worker.reserve(other)  # the fold is this worker's verdict: it cannot give one
    progress = project(log, tmp_path / "state")
    bad = len(GARBAGE) + len(UNKNOWN_SCHEMA)
    assert progress.rejected == bad and progress.accepted == 4
    reader = open_reader(tmp_path / "state")
    assert reader.get(KEY).state is State.DISPATCHED  # type: ignore[union-attr]
    kept = list(reader.rejected())
    assert [r.raw for r in kept] == GARBAGE + UNKNOWN_SCHEMA  # raw bytes kept, in log order
    # b"" is a tombstone (an expiry), refused for a key that is not settled
    assert {r.reason for r in kept} == {"undecodable", "payload_mismatch", "not_settled"}
    reader.close()
    run = Replay(log)
    assert len(list(run)) == bad + 4
    assert run.summary.violation_count == bad


def test_records_under_foreign_keys_do_not_stop_the_projector(log: EventLog, tmp_path: Path) -> None:
    for key in ("", "\x1b[31m", "k" * 5000, "agent:x:y:z"):
        log.append(EVENTS, key, good())
    Worker(log, "w1").create("op-2", KIND, TARGET, {"b": 2})
    progress = project(log, tmp_path / "state")
    assert progress.accepted == 1 and progress.rejected == 4


def test_rows_with_wrong_types_read_as_records(tmp_path: Path) -> None:
    """Another tool wrote TEXT values, non-UTF-8 keys and timestamps that are not integers."""
    url = f"sqlite:///{tmp_path}/log.db"
    log = open_log(url)
    Worker(log, "w1").create("op-1", KIND, TARGET, {"a": 1})
    log.close()
    db = sqlite3.connect(tmp_path / "log.db")
    db.execute("INSERT INTO events(key, value, ts) VALUES (?, ?, ?)", (KEY, "text value", "soon"))
    db.execute("INSERT INTO events(key, value, ts) VALUES (?, ?, ?)", (b"\xff\xfe", b"x", 1.5e12))
    db.execute("INSERT INTO events(key, value, ts) VALUES (?, ?, ?)", (KEY, 42, "12:00"))
    db.commit()
    db.close()
    log = open_log(url, create=False)
    records = log.read(EVENTS, 0, 0)
    assert [type(r.timestamp_ms) for r in records] == [int] * 4
    assert [r.value for r in records[1:]] == [b"text value", b"x", b"42"]
    assert records[2].key == "\ufffd\ufffd" and records[2].timestamp_ms == 1_500_000_000_000
    assert project(log, tmp_path / "state").rejected == 3
    since = list(Replay(log, ReplayFilter(since_ms=10**12)))
    assert [i.record.offset for i in since] == [0, 2]  # "soon" reads as 0, "12:00" as 12
    done = cli(tmp_path, "replay", "--since", "1h")
    assert done.returncode == 0, done.stderr  # the CREATE is recent; nothing undecodable in it
    assert "Traceback" not in done.stderr


# -- damaged files ----------------------------------------------------------------------------

@pytest.fixture
def world(tmp_path: Path) -> Path:
    log = open_log(f"sqlite:///{tmp_path}/log.db")
    worker = Worker(log, "w1")
    for n in range(40):  # enough rows for several pages
        worker.perform(f"op-{n}", KIND, TARGET, {"n": n, "pad": "x" * 300}, lambda call: {})
    stuck(worker, "op-stuck", State.DISPATCHED)
    project(log, tmp_path / "state")
    log.close()
    return tmp_path


CREATE = json.dumps({"operation_id": "op-new", "kind": KIND, "target": TARGET, "payload": {},
                     "transition": "create", "worker_id": "w1"}) + "\n"


def damage(path: Path, how: str) -> None:
    data = bytearray(path.read_bytes())
    if how == "truncated":
        data = data[: len(data) // 3 + 100]
    elif how == "header":
        data[:16] = b"not sqlite, no!!"
    else:  # a page in the middle: SQLite finds it only when it reads that page
        for n in range(4096 * 3, 4096 * 3 + 512):
            data[n] = (data[n] * 7 + 13) % 256
    path.write_bytes(bytes(data))


#: Commands that ask SQLite to check the whole file first (writers, and readers of the whole
#: log): a log SQLite reports malformed is refused even where the damage is in a page the
#: command would not read.
CHECKING = [("append",), ("replay",), ("project", "--once"), ("rebuild",),
            ("recover", "--once"), ("approve", KEY, "--decision", "retry", "--by", "a",
                                    "--reason", "b")]


@pytest.mark.parametrize("how", ["truncated", "header", "middle-page"])
@pytest.mark.parametrize("args", CHECKING, ids=lambda a: a[0])
def test_a_damaged_log_gives_one_line_and_exit_4(world: Path, how: str,
                                                 args: tuple[str, ...]) -> None:
    damage(world / "log.db", how)
    done = cli(world, *args, stdin=CREATE)
    one_error_line(done, 4)
    assert done.stdout == ""  # nothing reported appended, recovered or decided


@pytest.mark.parametrize("how", ["truncated", "header"])
@pytest.mark.parametrize("args", [("history", KEY), ("stats",)], ids=lambda a: a[0])
def test_point_reads_of_a_damaged_log_give_one_line_and_exit_4(world: Path, how: str,
                                                               args: tuple[str, ...]) -> None:
    damage(world / "log.db", how)
    one_error_line(cli(world, *args), 4)


@pytest.mark.parametrize("name", ["recovery", "reconciler"])
def test_damaged_bookkeeping_gives_one_line_and_exit_4(world: Path, name: str) -> None:
    consumers = world / "state.consumers"
    consumers.mkdir(exist_ok=True)
    (consumers / f"{name}.db").write_bytes(b"\x00\x01garbage" * 200)
    args = ("recover", "--once") if name == "recovery" else \
        ("reconcile", "--once", "--provider", f"fake:///{world}/provider.db")
    one_error_line(cli(world, *args), 4)


def test_a_damaged_provider_file_gives_one_line_and_exit_4(world: Path) -> None:
    (world / "provider.db").write_bytes(b"garbage" * 500)
    one_error_line(cli(world, "reconcile", "--once", "--provider",
                       f"fake:///{world}/provider.db"), 4)


@pytest.mark.parametrize("args", [("get", KEY), ("list",), ("stats",), ("project", "--once"),
                                  ("recover", "--once")], ids=lambda a: a[0])
def test_damaged_projection_files_give_one_line_and_exit_4(world: Path,
                                                           args: tuple[str, ...]) -> None:
    generation = layout.current_generation(world / "state")
    assert generation is not None
    tables = sorted((generation / "p-0").glob("*.sst"))
    assert tables
    for table in tables:
        data = bytearray(table.read_bytes())
        for n in range(0, len(data) - 64, 97):
            data[n] ^= 0x5A
        table.write_bytes(bytes(data))
    one_error_line(cli(world, *args), 4)
