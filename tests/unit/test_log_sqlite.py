from __future__ import annotations

import multiprocessing
import sqlite3
import threading
from pathlib import Path

import pytest

from effectlog.errors import BackendUnavailable, InvalidInput
from effectlog.log import EVENTS, EventLog, open_log
from effectlog.log.sqlite_rows import path_from_url
from tests.log_contract import LogContract


class TestSqliteLog(LogContract):
    @pytest.fixture
    def log(self, tmp_path: Path) -> EventLog:
        return open_log(f"sqlite:///{tmp_path}/log.db")


def _appender(url: str, worker: int, count: int) -> None:
    log = open_log(url)
    for i in range(count):
        log.append(EVENTS, f"agent:w{worker}-{i % 5}:k:t", f"{worker}:{i}".encode())
    log.close()


def test_concurrent_processes_lose_nothing_and_keep_per_key_order(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/shared.db"
    open_log(url).close()
    workers, count = 4, 2000
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_appender, args=(url, w, count)) for w in range(workers)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    log = open_log(url)
    records = list(log.scan(EVENTS, 0))
    assert len(records) == workers * count
    assert [r.offset for r in records] == list(range(workers * count))
    seen: dict[int, list[int]] = {}
    for r in records:
        w, i = map(int, r.value.decode().split(":"))
        seen.setdefault(w, []).append(i)
    assert all(seen[w] == list(range(count)) for w in range(workers))


def test_a_fresh_log_opens_while_another_connection_holds_its_lock(tmp_path: Path) -> None:
    """SQLite refuses the switch to WAL at once, without its busy timeout, while another
    connection holds the file's lock: several workers opening one new log together hit this."""
    path = tmp_path / "fresh.db"
    path.touch()
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")  # holds the write lock, as a second opener would
    timer = threading.Timer(0.3, holder.rollback)
    timer.start()
    try:
        log = open_log(f"sqlite:///{path}")
        assert log.partitions(EVENTS) == 1
        log.close()
        with sqlite3.connect(path) as check:
            assert check.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    finally:
        timer.cancel()
        holder.close()


def test_relative_and_absolute_urls() -> None:
    assert path_from_url("sqlite:///rel/log.db") == Path("rel/log.db")
    assert path_from_url("sqlite:////abs/log.db") == Path("/abs/log.db")
    with pytest.raises(InvalidInput):
        path_from_url("sqlite://")


def test_a_path_through_a_file_is_bad_input(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(InvalidInput, match="Not a directory"):
        open_log(f"sqlite:///{blocker}/log.db")


def test_an_unreadable_file_is_backend_unavailable(tmp_path: Path) -> None:
    (tmp_path / "log.db").write_bytes(b"\x00" * 4096)
    with pytest.raises(BackendUnavailable):
        open_log(f"sqlite:///{tmp_path}/log.db")


def test_log_directory_is_private(tmp_path: Path) -> None:
    open_log(f"sqlite:///{tmp_path}/private/log.db").close()
    assert (tmp_path / "private").stat().st_mode & 0o777 == 0o700
