"""Embedded event log in one SQLite file: ``sqlite:///relative.db`` or ``sqlite:////abs.db``.

WAL mode with ``synchronous=FULL``, so a commit is on disk when ``append`` returns. Several
processes may append to one file; SQLite's write lock serialises them and the table's
integer primary key gives each topic a gap-free, per-process-safe offset sequence.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from effectlog.errors import BackendUnavailable, InvalidInput
from effectlog.log.base import TOPICS, EventLog, Position, Record

_POLL_S = 0.02


def path_from_url(url: str) -> Path:
    """``sqlite:///a/b.db`` is relative (``a/b.db``); ``sqlite:////a/b.db`` is absolute."""
    if not url.startswith("sqlite:///") or len(url) <= len("sqlite:///"):
        raise InvalidInput(f"invalid sqlite URL {url!r}: use sqlite:///relative.db or sqlite:////abs.db")
    return Path(url[len("sqlite:///"):].split("?", 1)[0])


class SqliteLog(EventLog):
    """One table per topic; offset = rowid - 1; one partition."""

    conditional = True
    concurrent_appends = 1

    def __init__(self, path: str | os.PathLike[str], busy_timeout_s: float = 30.0) -> None:
        self.path = Path(path)
        self.url = f"sqlite:///{self.path}"
        self._lock = threading.RLock()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            self._db = sqlite3.connect(self.path, timeout=busy_timeout_s,
                                       isolation_level=None, check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            for topic in TOPICS:
                self._db.execute(
                    f"CREATE TABLE IF NOT EXISTS {topic} (rid INTEGER PRIMARY KEY, "
                    "key TEXT NOT NULL, value BLOB NOT NULL, ts INTEGER NOT NULL)")
                self._db.execute(f"CREATE INDEX IF NOT EXISTS {topic}_key ON {topic}(key, rid)")
        except (sqlite3.Error, OSError) as exc:
            raise BackendUnavailable(f"cannot open sqlite log {self.path}: {exc}") from exc

    @classmethod
    def from_url(cls, url: str) -> SqliteLog:
        return cls(path_from_url(url))

    def partitions(self, topic: str) -> int:
        return 1

    def partition_for(self, topic: str, key: str) -> int:
        return 0

    def append(self, topic: str, key: str, value: bytes) -> Position:
        return self.append_many(topic, [(key, value)])[0]

    def append_after(self, topic: str, key: str, values: Sequence[bytes],
                     last_offset: int | None) -> list[Position] | None:
        return self._append(topic, [(key, value) for value in values], (key, last_offset))

    def last_offset(self, topic: str, key: str) -> int | None:
        rows = self._query(f"SELECT MAX(rid) FROM {_table(topic)} WHERE key = ?", (key,))
        return None if rows[0][0] is None else int(rows[0][0]) - 1

    def append_many(self, topic: str, items: Sequence[tuple[str, bytes]]) -> list[Position]:
        positions = self._append(topic, items, None)
        assert positions is not None
        return positions

    def _append(self, topic: str, items: Sequence[tuple[str, bytes]],
                condition: tuple[str, int | None] | None) -> list[Position] | None:
        table = _table(topic)
        stamp = int(time.time() * 1000)
        with self._lock:
            try:
                if len(items) == 1:
                    rid = self._append_one(table, items[0], stamp, condition)
                    return None if rid is None else [Position(topic, 0, rid - 1)]
                rids = self._append_batch(table, items, stamp, condition)
            except sqlite3.Error as exc:
                raise BackendUnavailable(f"sqlite append to {self.path} failed: {exc}") from exc
        return None if rids is None else [Position(topic, 0, rid - 1) for rid in rids]

    def _append_one(self, table: str, item: tuple[str, bytes], stamp: int,
                    condition: tuple[str, int | None] | None) -> int | None:
        """One record in one autocommit statement: its own durable transaction. SQLite
        takes the write lock before the statement reads, so the condition and the insert
        are one atomic step."""
        key, value = item
        if condition is None:
            cursor = self._db.execute(f"INSERT INTO {table}(key, value, ts) VALUES (?, ?, ?)",
                                      (key, value, stamp))
        else:
            expected = None if condition[1] is None else condition[1] + 1
            cursor = self._db.execute(
                f"INSERT INTO {table}(key, value, ts) SELECT ?, ?, ? "
                f"WHERE (SELECT MAX(rid) FROM {table} WHERE key = ?) IS ?",
                (key, value, stamp, condition[0], expected))
            if cursor.rowcount != 1:
                return None
        return int(cursor.lastrowid or 0)

    def _append_batch(self, table: str, items: Sequence[tuple[str, bytes]], stamp: int,
                      condition: tuple[str, int | None] | None) -> list[int] | None:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            if condition is not None:
                row = self._db.execute(f"SELECT MAX(rid) FROM {table} WHERE key = ?",
                                       (condition[0],)).fetchone()
                last = None if row[0] is None else int(row[0]) - 1
                if last != condition[1]:
                    self._db.execute("ROLLBACK")
                    return None
            rids = [int(self._db.execute(f"INSERT INTO {table}(key, value, ts) VALUES (?, ?, ?)",
                                         (key, value, stamp)).lastrowid or 0)
                    for key, value in items]
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        return rids

    def read(self, topic: str, partition: int, offset: int, limit: int = 1000,
             timeout: float = 0.0) -> list[Record]:
        table = _table(topic)
        deadline = time.monotonic() + timeout
        while True:
            rows = self._query(f"SELECT rid, key, value, ts FROM {table} WHERE rid > ? "
                               "ORDER BY rid LIMIT ?", (offset, limit))
            if rows or time.monotonic() >= deadline:
                return [Record(topic, 0, rid - 1, key, bytes(value), ts)
                        for rid, key, value, ts in rows]
            time.sleep(_POLL_S)

    def end_offsets(self, topic: str) -> dict[int, int]:
        rows = self._query(f"SELECT COALESCE(MAX(rid), 0) FROM {_table(topic)}", ())
        return {0: int(rows[0][0])}

    def read_key(self, topic: str, key: str) -> list[Record]:
        rows = self._query(f"SELECT rid, key, value, ts FROM {_table(topic)} WHERE key = ? "
                           "ORDER BY rid", (key,))
        return [Record(topic, 0, rid - 1, k, bytes(v), ts) for rid, k, v, ts in rows]

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _query(self, sql: str, args: tuple[object, ...]) -> list[tuple[int, str, bytes, int]]:
        with self._lock:
            try:
                return self._db.execute(sql, args).fetchall()
            except sqlite3.Error as exc:
                raise BackendUnavailable(f"sqlite read from {self.path} failed: {exc}") from exc


def _table(topic: str) -> str:
    if topic not in TOPICS:
        raise InvalidInput(f"unknown topic {topic!r}")
    return topic
