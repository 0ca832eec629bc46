"""Reading never writes: read commands work on a projection and a log they may not write.

rocksdict rewrites ``rocksdict-config.json`` in every directory it opens, and the SQLite log was
opened read-write (switched to WAL) by commands that only read it. A read-only projection or log
directory then failed reads with exit 4, and every read changed the projection's files.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from effectlog.log.base import EVENTS
from effectlog.log.sqlite import SqliteLog
from projections import open_reader
from tests.unit.test_state_dir_safety import KEY, write_log

EFFECTLOG = Path(sys.executable).with_name("effectlog")


def files(root: Path) -> dict[str, tuple[int, int, bytes]]:
    """Every entry under ``root`` with its mtime, size and (files) content."""
    out = {}
    for path in sorted(root.rglob("*")):
        info = path.lstat()
        content = path.read_bytes() if stat.S_ISREG(info.st_mode) else b""
        out[str(path.relative_to(root))] = (info.st_mtime_ns, info.st_size, content)
    return out


def set_writable(root: Path, writable: bool) -> None:
    for path in [root, *root.rglob("*")]:
        if path.is_symlink():
            continue
        mode = path.stat().st_mode
        os.chmod(path, mode | stat.S_IWUSR if writable else mode & ~0o222)


def without_dac_override() -> tuple[str, ...]:
    """A command prefix under which root, too, obeys permission bits (none for other users)."""
    if os.geteuid() != 0:
        return ()
    if shutil.which("setpriv") is None:
        return ()  # root without setpriv: only the unchanged files are checked
    return ("setpriv", "--bounding-set=-dac_override,-dac_read_search")


@pytest.fixture
def frozen(tmp_path: Path) -> Iterator[Path]:
    """A log and its caught-up projection in a directory nobody may write (restored after)."""
    root = tmp_path / "ro"
    root.mkdir()
    write_log(root / "log.db")
    done = subprocess.run([str(EFFECTLOG), "--log", f"sqlite:///{root}/log.db", "--state",
                           str(root / "state"), "project", "--once", "--quiet"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    set_writable(root, False)
    try:
        yield root
    finally:
        set_writable(root, True)


@pytest.mark.parametrize("args", [
    ("get", KEY, "--no-catch-up"), ("get", KEY), ("list", "--no-catch-up"), ("list",),
    ("stats", "--no-catch-up"), ("expire", "--older-than", "1h", "--dry-run"),
    ("history", KEY), ("replay",)], ids=lambda a: " ".join(x for x in a if ":" not in x))
def test_read_commands_work_on_a_read_only_state_and_log_and_change_nothing(
        frozen: Path, args: tuple[str, ...]) -> None:
    before = files(frozen)
    done = subprocess.run([*without_dac_override(), str(EFFECTLOG), "--log",
                           f"sqlite:///{frozen}/log.db", "--state", str(frozen / "state"),
                           *args], capture_output=True, text=True, timeout=60, input="")
    assert done.returncode == 0, done.stderr
    assert files(frozen) == before


def test_a_read_only_reader_leaves_the_projection_files_as_they_were(tmp_path: Path) -> None:
    """In a writable directory too: opening the projection to read rewrites nothing (the
    config file rocksdict writes on every open among them)."""
    write_log(tmp_path / "log.db")
    subprocess.run([str(EFFECTLOG), "--log", f"sqlite:///{tmp_path}/log.db", "--state",
                    str(tmp_path / "state"), "project", "--once", "--quiet"], check=True,
                   timeout=60)
    generation = (tmp_path / "state").resolve()
    before = files(generation)
    reader = open_reader(tmp_path / "state")
    try:
        assert reader.get(KEY) is not None and reader.counts()
    finally:
        reader.close()
    assert files(generation) == before


def test_a_log_opened_without_create_reads_read_only_and_writes_on_demand(tmp_path: Path) -> None:
    write_log(tmp_path / "log.db", 1)
    log = SqliteLog(tmp_path / "log.db", create=False)
    try:
        assert log.end_offsets(EVENTS) == {0: 2}
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            log._db.execute("CREATE TABLE probe (x)")  # the reading connection cannot write
        log.append(EVENTS, "k", b"v")  # the first write opens the log read-write
        assert log.end_offsets(EVENTS) == {0: 3}
        assert log._db.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        assert log._db.execute("PRAGMA synchronous").fetchone() == (2,)  # FULL
    finally:
        log.close()
    reread = SqliteLog(tmp_path / "log.db", create=False)
    assert [r.key for r in reread.read_key(EVENTS, "k")] == ["k"]
    reread.close()
