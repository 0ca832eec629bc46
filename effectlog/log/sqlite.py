"""Embedded event log in one SQLite file: ``sqlite:///relative.db`` or ``sqlite:////abs.db``.

WAL mode with ``synchronous=FULL``, so a commit is on disk when ``append`` returns. Several
processes may append to one file; SQLite's write lock serialises them and the table's
integer primary key gives each topic a gap-free, per-process-safe offset sequence.

A log opened without ``create`` (every command but the ones that create effects) is read
through a ``query_only`` connection until its first write: reading it never changes the log
or its journal mode, and works in a directory it may not write.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from effectlog.errors import BackendUnavailable, InvalidInput, LogMissing
from effectlog.log.base import EVENTS, TOMBSTONE, TOPICS, EventLog, Position, Record
from effectlog.log.sqlite_rows import (
    COLUMNS,
    enable_wal,
    key_records,
    path_error,
    path_from_url,
    record,
    table_names,
    table_of,
)
from effectlog.private_fs import create_private_file, make_private_dirs

if TYPE_CHECKING:
    from effectlog.model import EffectEvent

_POLL_S = 0.02
_META = "meta"
#: Errors of a reader that may not write the file or make its ``-wal``/``-shm`` beside it.
_NO_INDEX = ("SQLITE_READONLY", "SQLITE_CANTOPEN")


class SqliteLog(EventLog):
    """One table per topic; offset = rowid - 1; one partition."""

    conditional = True
    concurrent_appends = 1

    def __init__(self, path: str | os.PathLike[str], busy_timeout_s: float = 30.0, *,
                 create: bool = True) -> None:
        if "\x00" in os.fspath(path):
            raise InvalidInput("a sqlite log path cannot contain a NUL character")
        self.path = Path(path).absolute()
        self.url = f"sqlite:///{self.path}"
        self._lock = threading.RLock()
        self._busy_timeout_s = busy_timeout_s
        self._writable = False
        try:
            existed = self.path.exists()
        except OSError as exc:
            raise path_error(self.path, exc) from None
        if not existed and not create:
            raise LogMissing(f"no sqlite log at {self.path}")
        try:
            if not existed:
                make_private_dirs(self.path.parent)
                create_private_file(self.path)
            if create:  # a writer: read-write from the start
                self._db = self._connect_rw()
            else:  # read-only until the first write (see _writer)
                self._db = self._connect_ro()
            try:
                self._id = self._schema(initialise=create or not existed)
            except BaseException:
                self._db.close()
                raise
        except OSError as exc:
            raise path_error(self.path, exc) from exc
        except sqlite3.Error as exc:
            raise BackendUnavailable(f"cannot open sqlite log {self.path}: {exc}") from exc

    def _connect(self, flags: str) -> sqlite3.Connection:
        return sqlite3.connect(f"file:{quote(str(self.path))}?{flags}", uri=True,
                               timeout=self._busy_timeout_s, isolation_level=None,
                               check_same_thread=False)

    def _connect_rw(self) -> sqlite3.Connection:
        """A read-write connection in WAL mode with ``synchronous=FULL``; mode=rw: never
        creates the file here, even if it vanished since it was looked for."""
        db = self._connect("mode=rw")
        try:
            tables = table_names(db)
            if EVENTS not in tables and tables:
                raise BackendUnavailable(f"{self.path} is not an effectlog log: it has no "
                                         f"{EVENTS} table")
            enable_wal(db, time.monotonic() + self._busy_timeout_s)  # only once it is ours
            db.execute("PRAGMA synchronous=FULL")
        except BaseException:
            db.close()
            raise
        self._writable = True
        return db

    def _connect_ro(self) -> sqlite3.Connection:
        """A connection that cannot write: ``query_only``, so it never changes the log nor
        switches its journal mode, and it sees what writers commit. Read-write at the file
        level where it can be, so that SQLite removes the ``-wal``/``-shm`` files it makes
        for a reader when the last connection closes; ``mode=ro`` where the file or its
        directory may not be written. A reader of a WAL file needs SQLite's ``-shm`` index:
        where none can be made and there is no ``-wal`` file (no writer has the log open,
        nor could one in such a directory), the file is read as ``immutable``."""
        last: sqlite3.OperationalError | None = None
        for flags in ("mode=rw", "mode=ro"):
            db = self._connect(flags)
            try:
                db.execute("PRAGMA query_only=ON")
                table_names(db)  # the first read opens the WAL index, or fails without one
                return db
            except sqlite3.OperationalError as exc:
                db.close()
                if not getattr(exc, "sqlite_errorname", "").startswith(_NO_INDEX):
                    raise
                last = exc
        assert last is not None
        if os.path.exists(f"{self.path}-wal"):
            raise last
        db = self._connect("mode=ro&immutable=1")
        db.execute("PRAGMA query_only=ON")
        return db

    def _writer(self) -> sqlite3.Connection:
        """The connection to write with: a log opened read-only becomes read-write at its
        first write (held under ``_lock``)."""
        if not self._writable:
            writer = self._connect_rw()
            self._db.close()
            self._db = writer
        return self._db

    def _schema(self, initialise: bool) -> str:
        """The log's id; creates tables and id when missing (a file just made, or a log
        from before ids existed). A SQLite file holding anything else is refused."""
        tables = table_names(self._db)
        if EVENTS not in tables and (tables or not initialise):
            raise BackendUnavailable(f"{self.path} is not an effectlog log: it has no "
                                     f"{EVENTS} table")
        if {*TOPICS, _META} <= tables:
            found = self._log_id()
            if found is not None:
                return found
        db = self._writer()  # a log without its tables or id yet: written once, here
        db.execute("BEGIN IMMEDIATE")
        try:
            for topic in TOPICS:
                db.execute(
                    f"CREATE TABLE IF NOT EXISTS {topic} (rid INTEGER PRIMARY KEY, "
                    "key TEXT NOT NULL, value BLOB NOT NULL, ts INTEGER NOT NULL)")
                db.execute(f"CREATE INDEX IF NOT EXISTS {topic}_key ON {topic}(key, rid)")
            db.execute(f"CREATE TABLE IF NOT EXISTS {_META} "
                       "(name TEXT PRIMARY KEY, value TEXT NOT NULL)")
            db.execute(f"INSERT OR IGNORE INTO {_META} VALUES ('log_id', ?)",
                       (uuid.uuid4().hex,))
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        found = self._log_id()
        assert found is not None
        return found

    def _log_id(self) -> str | None:
        row = self._db.execute(f"SELECT value FROM {_META} WHERE name = 'log_id'").fetchone()
        return None if row is None else str(row[0])

    def identity(self) -> str:
        return self._id

    def verify(self) -> None:
        """SQLite's quick_check over the whole file (about 1 ms per MB)."""
        with self._lock:
            try:
                rows = self._db.execute("PRAGMA quick_check").fetchall()
            except sqlite3.Error as exc:
                raise BackendUnavailable(f"sqlite log {self.path} is damaged: {exc}") from exc
        if rows != [("ok",)]:
            raise BackendUnavailable(f"sqlite log {self.path} is damaged: {rows[0][0]}")

    @classmethod
    def from_url(cls, url: str, *, create: bool = True) -> SqliteLog:
        return cls(path_from_url(url), create=create)

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
        rows = self._query(f"SELECT MAX(rid) FROM {table_of(topic)} WHERE key = ?", (key,))
        return None if rows[0][0] is None else int(rows[0][0]) - 1

    def append_many(self, topic: str, items: Sequence[tuple[str, bytes]]) -> list[Position]:
        positions = self._append(topic, items, None)
        assert positions is not None
        return positions

    def _append(self, topic: str, items: Sequence[tuple[str, bytes]],
                condition: tuple[str, int | None] | None) -> list[Position] | None:
        table = table_of(topic)
        stamp = int(time.time() * 1000)
        with self._lock:
            try:
                self._writer()
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
        table = table_of(topic)
        deadline = time.monotonic() + timeout
        while True:
            found = self._read_range(topic, table, offset, limit)
            if found or time.monotonic() >= deadline:
                return found
            time.sleep(_POLL_S)

    def _read_range(self, topic: str, table: str, offset: int, limit: int) -> list[Record]:
        """Up to ``limit`` records after ``offset``, in one read transaction with the look,
        for each tombstone among them, for an earlier record of its key (a purge mark when
        none is left): a purge between the two cannot split them."""
        with self._lock:
            db = self._db
            try:
                db.execute("BEGIN")
                try:
                    rows = db.execute(f"SELECT {COLUMNS} FROM {table} WHERE rid > ? "
                                      "ORDER BY rid LIMIT ?", (offset, limit)).fetchall()
                    marks = {rid for rid, _, value, _ in rows if not value and db.execute(
                        f"SELECT 1 FROM {table} WHERE key = (SELECT key FROM {table} "
                        "WHERE rid = ?) AND rid < ? LIMIT 1", (rid, rid)).fetchone() is None}
                finally:
                    db.execute("COMMIT")
            except sqlite3.Error as exc:
                raise BackendUnavailable(f"sqlite read from {self.path} failed: {exc}") from exc
        return [record(topic, row, purge_mark=row[0] in marks) for row in rows]

    def end_offsets(self, topic: str) -> dict[int, int]:
        rows = self._query(f"SELECT COALESCE(MAX(rid), 0) FROM {table_of(topic)}", ())
        return {0: int(rows[0][0])}

    def expire(self, effects: Sequence[tuple[str, str]]) -> dict[str, Position]:
        """Tombstones of the effects their keys still end with (see :meth:`EventLog.expire`),
        each key folded under the write lock, all in one transaction (one fsync a pass)."""
        table = table_of(EVENTS)
        stamp = int(time.time() * 1000)
        written: dict[str, Position] = {}
        with self._transaction("expiry") as db:
            for key, event_id in effects:
                current = self._fold(table, key)
                if current is None or current.event_id != event_id:
                    continue  # expired already, and perhaps used again since
                rid = db.execute(f"INSERT INTO {table}(key, value, ts) VALUES (?, ?, ?)",
                                 (key, TOMBSTONE, stamp)).lastrowid
                written[key] = Position(EVENTS, 0, int(rid or 0) - 1)
        return written

    @contextlib.contextmanager
    def _transaction(self, what: str) -> Iterator[sqlite3.Connection]:
        """One write transaction under the lock, rolled back on any error; a SQLite error
        is :class:`BackendUnavailable` naming ``what``."""
        with self._lock:
            try:
                db = self._writer()
                db.execute("BEGIN IMMEDIATE")
                try:
                    yield db
                    db.execute("COMMIT")
                except BaseException:
                    db.execute("ROLLBACK")
                    raise
            except sqlite3.Error as exc:
                raise BackendUnavailable(f"sqlite {what} in {self.path} failed: {exc}") from exc

    def _fold(self, table: str, key: str) -> EffectEvent | None:
        """The key's state by the rules, from its records (inside the caller's transaction)."""
        from effectlog.machine import fold
        from effectlog.view import decode_events

        records = key_records(EVENTS, self._db.execute(
            f"SELECT {COLUMNS} FROM {table} WHERE key = ? ORDER BY rid", (key,)).fetchall())
        return fold(decode_events(self, key, records))[0]

    def purge_expired(self, before_ms: int) -> int:
        """Delete the records before each tombstone logged before ``before_ms`` that ends
        its key and that the rules accepted (the key's fold ends with nothing), in one
        transaction; the number deleted. The tombstone stays, first of its key now: read
        back, it is a *purge mark* (``Record.expires`` is :data:`PURGED`), which removes
        whatever its key holds. So a projection that applied only part of what was deleted
        (one lagging behind the purge) forgets the key there, as a full replay has it
        forgotten; one empty row per expired key is what a purge keeps."""
        table = table_of(EVENTS)
        purged = 0
        with self._transaction("purge") as db:
            rows = db.execute(
                f"SELECT e.key, e.rid FROM {table} e JOIN (SELECT key, MAX(rid) AS last "
                f"FROM {table} GROUP BY key) l ON e.key = l.key AND e.rid = l.last "
                "WHERE length(e.value) = 0 AND e.ts < ? AND EXISTS "
                f"(SELECT 1 FROM {table} p WHERE p.key = e.key AND p.rid < e.rid)",
                (before_ms,)).fetchall()
            for key, last in rows:
                if self._fold(table, key) is not None:
                    continue  # the tombstone was rejected: the key is alive
                purged += db.execute(f"DELETE FROM {table} WHERE key = ? AND rid < ?",
                                     (key, last)).rowcount
        return purged

    def read_key(self, topic: str, key: str) -> list[Record]:
        table = table_of(topic)
        return key_records(topic, self._query(f"SELECT {COLUMNS} FROM {table} WHERE key = ? "
                                              "ORDER BY rid", (key,)))

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _query(self, sql: str, args: tuple[object, ...]) -> list[tuple[Any, ...]]:
        with self._lock:
            try:
                return self._db.execute(sql, args).fetchall()
            except sqlite3.Error as exc:
                raise BackendUnavailable(f"sqlite read from {self.path} failed: {exc}") from exc
