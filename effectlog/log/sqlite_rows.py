"""The SQLite log's file and rows: its URL, its tables, how a row reads as a record."""

from __future__ import annotations

import errno
import sqlite3
import time
from pathlib import Path
from typing import Any

from effectlog.errors import BackendUnavailable, EffectlogError, InvalidInput
from effectlog.log.base import PURGED, TOPICS, Record
from effectlog.text import shorten


def path_from_url(url: str) -> Path:
    """``sqlite:///a/b.db`` is relative (``a/b.db``); ``sqlite:////a/b.db`` is absolute."""
    if not url.startswith("sqlite:///") or len(url) <= len("sqlite:///"):
        raise InvalidInput(f"invalid sqlite URL {shorten(url)}: use sqlite:///relative.db or "
                           "sqlite:////abs.db")
    path = url[len("sqlite:///"):].split("?", 1)[0]
    if not path or "\x00" in path:
        raise InvalidInput(f"invalid sqlite URL {shorten(url)}: no file path")
    return Path(path)


def table_names(db: sqlite3.Connection) -> set[str]:
    return {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def enable_wal(db: sqlite3.Connection, deadline: float) -> None:
    """Switch a new file to WAL. SQLite answers the switch with "database is locked" at
    once, without its busy handler, while another process holds the file (several workers
    opening a fresh log together), so the switch is retried until ``deadline``."""
    pause = 0.001
    while True:
        try:
            db.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() + pause > deadline:
                raise
        time.sleep(pause)
        pause = min(pause * 2, 0.05)


def path_error(path: Path, exc: OSError) -> EffectlogError:
    """A path that cannot name a file here is bad input (2); anything else, such as a
    permission or a full disk, is the backend being unavailable (4)."""
    message = f"cannot open sqlite log {path}: {exc.strerror or exc}"
    if exc.errno in (errno.ENAMETOOLONG, errno.ENOTDIR, errno.ELOOP, errno.EISDIR):
        return InvalidInput(message)
    return BackendUnavailable(message)


def table_of(topic: str) -> str:
    if topic not in TOPICS:
        raise InvalidInput(f"unknown topic {topic!r}")
    return topic


#: The columns :func:`record` reads a row from: as bytes and integers whatever another tool
#: stored in them, so a foreign or damaged row becomes an undecodable record, never an
#: exception in the reader.
COLUMNS = "rid, CAST(key AS BLOB), CAST(value AS BLOB), CAST(ts AS INTEGER)"


def record(topic: str, row: tuple[Any, ...], *, purge_mark: bool = False) -> Record:
    """A Record from a row of :data:`COLUMNS` (key bytes that are not UTF-8 are replaced);
    ``purge_mark``: a tombstone with no earlier record of its key left (a purge deleted
    them, see :meth:`SqliteLog.purge_expired`)."""
    rid, key, value, ts = row
    return Record(topic, 0, rid - 1, key.decode("utf-8", "replace") if key is not None else "",
                  value if value is not None else b"", ts if ts is not None else 0,
                  PURGED if purge_mark else None)


def key_records(topic: str, rows: list[tuple[Any, ...]]) -> list[Record]:
    """The records of all of one key's rows, in log order: a tombstone first is a purge mark."""
    return [record(topic, row, purge_mark=index == 0 and not row[2])
            for index, row in enumerate(rows)]
