"""A log has an identity; state built from it refuses a log that is missing, another one, or
shorter than its stored offsets (exit 4, nothing written), and `rebuild` adopts a new log."""

from __future__ import annotations

import hashlib
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from consumers.bookkeeping import CommandLedger, OffsetStore, consumer_db_path
from effectlog.errors import BackendUnavailable, LogMissing, WrongLog
from effectlog.log import EVENTS, open_log
from effectlog.log.memory import MemoryLog
from effectlog.log.sqlite import SqliteLog
from effectlog.model import State
from effectlog.worker import Worker
from projections import open_reader
from projections.projector import Projector, project
from projections.rocksdb.digest import projection_digest
from tests.recovery_support import stuck

EFFECTLOG = Path(sys.executable).with_name("effectlog")
KIND, TARGET = "email.send", "mailto:a@example.com"


def effects(url: str, count: int, start: int = 0) -> None:
    log = open_log(url)
    worker = Worker(log, "w1")
    for n in range(start, start + count):
        worker.perform(f"op-{n}", KIND, TARGET, {"n": n}, lambda call: {"ok": True})
    log.close()


def tree(root: Path) -> dict[str, str]:
    """Every file under ``root`` with a digest of its content (what "nothing written" means)."""
    out = {}
    for path in sorted(root.rglob("*")):
        if path.is_file() and not path.is_symlink():
            out[str(path.relative_to(root))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def cli(tmp: Path, *args: str, log: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(EFFECTLOG), "--log", log or f"sqlite:///{tmp}/log.db", "--state",
                           str(tmp / "state"), *args], capture_output=True, text=True,
                          cwd=tmp, timeout=60, input="")


# -- the identity itself ---------------------------------------------------------------------

def test_a_sqlite_log_keeps_its_identity_and_another_file_has_another(tmp_path: Path) -> None:
    first = open_log(f"sqlite:///{tmp_path}/a.db")
    identity = first.identity()
    first.close()
    assert identity is not None and open_log(f"sqlite:///{tmp_path}/a.db").identity() == identity
    assert open_log(f"sqlite:///{tmp_path}/b.db").identity() not in (None, identity)
    assert MemoryLog().identity() != MemoryLog().identity()


def test_a_log_made_before_identities_gets_one_when_opened(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    db = sqlite3.connect(path)
    for topic in ("events", "commands"):
        db.execute(f"CREATE TABLE {topic} (rid INTEGER PRIMARY KEY, key TEXT NOT NULL, "
                   "value BLOB NOT NULL, ts INTEGER NOT NULL)")
    db.execute("INSERT INTO events(key, value, ts) VALUES ('k', x'00', 1)")
    db.commit()
    db.close()
    log = SqliteLog(path, create=False)
    assert log.identity() and log.end_offsets(EVENTS) == {0: 1}


def test_opening_a_missing_log_without_create_creates_nothing(tmp_path: Path) -> None:
    with pytest.raises(LogMissing, match=f"no sqlite log at {tmp_path}/x/y/log.db"):
        open_log(f"sqlite:///{tmp_path}/x/y/log.db", create=False)
    assert list(tmp_path.iterdir()) == []


def test_a_relative_sqlite_url_names_its_absolute_path(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert open_log("sqlite:///tmp/x.db").url == f"sqlite:///{tmp_path}/tmp/x.db"


@pytest.mark.parametrize("content", [b"", b"SQLite format 3\x00" + b"\x00" * 84])
def test_an_empty_file_is_no_log_to_read(tmp_path: Path, content: bytes) -> None:
    (tmp_path / "log.db").write_bytes(content)
    with pytest.raises(BackendUnavailable):
        open_log(f"sqlite:///{tmp_path}/log.db", create=False)


def test_a_sqlite_file_of_another_application_is_never_taken_over(tmp_path: Path) -> None:
    db = sqlite3.connect(tmp_path / "app.db")
    db.execute("CREATE TABLE users (id INTEGER)")
    db.commit()
    db.close()
    with pytest.raises(BackendUnavailable, match="not an effectlog log"):
        open_log(f"sqlite:///{tmp_path}/app.db")


# -- the projection ---------------------------------------------------------------------------

def test_the_projector_refuses_a_log_of_another_identity_and_writes_nothing(tmp_path: Path) -> None:
    effects(f"sqlite:///{tmp_path}/a.db", 3)
    effects(f"sqlite:///{tmp_path}/b.db", 5)
    project(open_log(f"sqlite:///{tmp_path}/a.db"), tmp_path / "state")
    before = projection_digest(tmp_path / "state")
    with pytest.raises(WrongLog, match="was built from log"):
        project(open_log(f"sqlite:///{tmp_path}/b.db"), tmp_path / "state")
    assert projection_digest(tmp_path / "state") == before


def test_the_projector_refuses_a_log_that_ends_before_its_offsets(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/log.db"
    effects(url, 2)
    shutil.copy(tmp_path / "log.db", tmp_path / "backup.db")  # same identity, fewer events
    effects(url, 2, start=2)
    project(open_log(url), tmp_path / "state")
    (tmp_path / "log.db").unlink()
    shutil.copy(tmp_path / "backup.db", tmp_path / "log.db")
    with pytest.raises(WrongLog, match=r"ends at offset 8 of partition 0.*up to offset 16"):
        Projector(open_log(url), tmp_path / "state").open()


# -- through the CLI --------------------------------------------------------------------------

@pytest.fixture
def built(tmp_path: Path) -> Path:
    """A log with a stuck effect, its projection and a recovery ledger."""
    log = open_log(f"sqlite:///{tmp_path}/log.db")
    stuck(Worker(log, "w1"), "op-1", State.DISPATCHED)
    log.close()
    assert cli(tmp_path, "project", "--once", "--quiet").returncode == 0
    assert cli(tmp_path, "recover", "--once", "--stuck-after", "0s").returncode == 0
    return tmp_path


COMMANDS_USING_STATE = [
    ("project", "--once"), ("stats",), ("recover", "--once", "--stuck-after", "0s"),
    ("reconcile", "--once", "--provider", "fake:///{tmp}/provider.db"),
    ("approve", "agent:op-1:email.send:mailto:a@example.com", "--decision", "retry", "--by",
     "ops", "--reason", "checked"),
    # the reads that catch the projection up with the log check it first, too
    ("get", "agent:op-1:email.send:mailto:a@example.com"), ("list",),
    ("get", "agent:op-1:email.send:mailto:a@example.com", "--json"),  # the fast path
    ("expire", "--dry-run", "--older-than", "1s"),
]


@pytest.mark.parametrize("args", COMMANDS_USING_STATE, ids=lambda a: a[0])
def test_a_lost_log_is_refused_with_exit_4_and_nothing_is_written(built: Path,
                                                                  args: tuple[str, ...]) -> None:
    (built / "log.db").rename(built / "away.db")
    before = tree(built)
    done = cli(built, *(a.format(tmp=built) for a in args))
    assert done.returncode == 4, done.stderr
    assert done.stderr.count("\n") == 1 and "was built from log" in done.stderr
    assert tree(built) == before and not (built / "log.db").exists()


@pytest.mark.parametrize("args", COMMANDS_USING_STATE, ids=lambda a: a[0])
def test_a_replaced_log_is_refused_with_exit_4_and_nothing_is_written(built: Path,
                                                                      args: tuple[str, ...]) -> None:
    (built / "log.db").rename(built / "away.db")
    effects(f"sqlite:///{built}/log.db", 1)  # a worker made a new, empty-ish log there
    before = tree(built)
    done = cli(built, *(a.format(tmp=built) for a in args))
    assert done.returncode == 4, done.stderr
    assert "was built from log" in done.stderr and "is log" in done.stderr
    assert tree(built) == before


@pytest.mark.parametrize("args", [("project", "--once"), ("list",),
                                  ("get", "agent:op-1:email.send:mailto:a@example.com")])
def test_a_shorter_log_is_refused(built: Path, args: tuple[str, ...]) -> None:
    db = sqlite3.connect(built / "log.db")
    db.execute("DELETE FROM events WHERE rid > 1")
    db.commit()
    db.close()
    done = cli(built, *args)
    assert done.returncode == 4 and "ends at offset 1 of partition 0" in done.stderr


def test_reads_of_an_unsupported_log_url_are_bad_input(built: Path) -> None:
    for args in (("get", "agent:op-1:email.send:mailto:a@example.com"), ("list",)):
        done = cli(built, *args, log="nosuch://x")
        assert done.returncode == 2 and "unsupported log URL" in done.stderr, done.stderr


def test_append_creates_a_log_only_where_no_state_claims_one(built: Path) -> None:
    create = ('{"operation_id": "op-2", "kind": "email.send", "target": "mailto:b@example.com",'
              ' "payload": {}, "transition": "create", "worker_id": "w1"}\n')
    (built / "log.db").rename(built / "away.db")
    refused = subprocess.run([str(EFFECTLOG), "--log", f"sqlite:///{built}/log.db", "--state",
                              str(built / "state"), "append"], input=create, capture_output=True,
                             text=True, timeout=60)
    assert refused.returncode == 4 and not (built / "log.db").exists()
    elsewhere = subprocess.run([str(EFFECTLOG), "--log", f"sqlite:///{built}/new/log.db",
                                "--state", str(built / "new" / "state"), "append"], input=create,
                               capture_output=True, text=True, timeout=60)
    assert elsewhere.returncode == 0, elsewhere.stderr
    assert (built / "new" / "log.db").exists()


@pytest.mark.parametrize("args", [("get", "agent:op-1:email.send:x"), ("list",), ("stats",),
                                  ("history", "agent:op-1:email.send:x"), ("replay",),
                                  ("project", "--once")], ids=lambda a: a[0])
def test_read_commands_on_a_mistyped_log_create_nothing(tmp_path: Path,
                                                        args: tuple[str, ...]) -> None:
    done = subprocess.run([str(EFFECTLOG), "--log", "sqlite:///no/such/dir/log.db", *args],
                          capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and str(tmp_path) in done.stderr
    assert list(tmp_path.iterdir()) == []


def test_rebuild_adopts_a_new_log_and_resets_the_bookkeeping_of_the_old(built: Path) -> None:
    (built / "log.db").rename(built / "away.db")
    effects(f"sqlite:///{built}/log.db", 2)
    assert cli(built, "project", "--once").returncode == 4
    done = cli(built, "rebuild", "--quiet")
    assert done.returncode == 0, done.stderr
    assert "adopted log" in done.stderr and "recovery.db" in done.stderr
    assert cli(built, "project", "--once").returncode == 0
    assert cli(built, "recover", "--once").returncode == 0
    new = open_log(f"sqlite:///{built}/log.db")
    ledger = CommandLedger(consumer_db_path(built / "state", "recovery"))
    assert ledger.tracked() == []  # the old log's command is forgotten
    ledger.bind(new)  # and the ledger now belongs to the new log
    reader = open_reader(built / "state")
    assert set(reader.log_ids().values()) == {new.identity()}
    reader.close()


def test_rebuild_of_the_same_log_keeps_the_bookkeeping(built: Path) -> None:
    done = cli(built, "rebuild", "--quiet")
    assert done.returncode == 0 and "adopted" not in done.stderr
    ledger = CommandLedger(consumer_db_path(built / "state", "recovery"))
    assert ledger.tracked() == ["agent:op-1:email.send:mailto:a@example.com"]


def test_reconciler_offsets_refuse_a_log_that_ends_before_them(tmp_path: Path) -> None:
    log = open_log(f"sqlite:///{tmp_path}/log.db")
    offsets = OffsetStore(tmp_path / "reconciler.db")
    offsets.bind(log)
    offsets.commit("commands", 0, 5)
    with pytest.raises(WrongLog, match="ends at offset 0 of commands partition 0"):
        offsets.bind(log)
