"""Durable bookkeeping of the consumers in small SQLite files under the state directory.

:class:`CommandLedger` remembers which reconciliation commands are outstanding (so a
restarted recovery consumer does not issue a second one); :class:`OffsetStore` keeps the
reconciler's consumed offsets of the commands topic.

Both describe one log and record its identity: :meth:`bind` refuses another log (and the
offset store a log that ends before its offsets) with :class:`WrongLog`, and
:func:`adopt_log` resets them when ``effectlog rebuild`` adopts a new log.
"""

from __future__ import annotations

import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path

from effectlog.errors import BackendUnavailable, WrongLog
from effectlog.log.base import COMMANDS, EventLog
from effectlog.private_fs import create_private_file, make_private_dirs

_META_SCHEMA = """
    CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


def consumer_db_path(state_dir: str | Path, name: str) -> Path:
    """``<state_dir>.consumers/<name>.db``: beside the projection, not inside it, since
    ``state_dir`` is a symlink swapped to a new generation on every rebuild."""
    base = Path(state_dir)
    return base.with_name(f"{base.name}.consumers") / f"{name}.db"


class _SqliteFile:
    """One SQLite connection in WAL mode with fsync on commit, shared by threads."""

    def __init__(self, path: str | Path, schema: str) -> None:
        self.path = Path(path)
        self._lock = threading.RLock()
        try:
            make_private_dirs(self.path.parent)
            create_private_file(self.path)
            self._db = sqlite3.connect(self.path, timeout=30.0, isolation_level=None,
                                       check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.executescript(schema + _META_SCHEMA)
        except (sqlite3.Error, OSError) as exc:
            raise BackendUnavailable(f"cannot open {self.path}: {exc}") from exc

    def bind(self, log: EventLog) -> None:
        """Record ``log``'s identity, or refuse a log with another one."""
        identity = log.identity()
        if identity is None:
            return
        rows = self.execute("SELECT value FROM meta WHERE name = 'log_id'")
        if not rows:
            self.execute("INSERT OR IGNORE INTO meta VALUES ('log_id', ?)", (identity,))
        elif rows[0][0] != identity:
            raise WrongLog(f"{self.path} was kept for log {rows[0][0]}, but {log.url} is log "
                           f"{identity}: {WrongLog.HINT}")

    def adopt(self, log: EventLog, tables: tuple[str, ...]) -> None:
        """Forget everything kept for an earlier log and belong to ``log`` from now on."""
        with self._lock:
            statements = [f"DELETE FROM {table}" for table in tables]
            statements.append("DELETE FROM meta")
            try:
                self._db.execute("BEGIN IMMEDIATE")
                for sql in statements:
                    self._db.execute(sql)
                self._db.execute("COMMIT")
            except sqlite3.Error as exc:
                self._db.execute("ROLLBACK")
                raise BackendUnavailable(f"{self.path}: {exc}") from exc
        self.bind(log)

    def execute(self, sql: str, args: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
        with self._lock:
            try:
                return self._db.execute(sql, args).fetchall()
            except sqlite3.Error as exc:
                raise BackendUnavailable(f"{self.path}: {exc}") from exc

    def close(self) -> None:
        with self._lock:
            self._db.close()


@dataclass(frozen=True, slots=True)
class Issued:
    """The last command issued for a key, the snapshot it was issued for and, once the
    append returned, where the command sits in the commands topic."""

    key: str
    state: str
    epoch: int
    occurred_at: int
    issued_at: int
    attempts: int
    command_id: str
    partition: int | None = None
    offset: int | None = None

    def same_snapshot(self, state: str, epoch: int, occurred_at: int) -> bool:
        return (self.state, self.epoch, self.occurred_at) == (state, epoch, occurred_at)

    def lost(self, ends: dict[int, int]) -> bool:
        """Whether the command is known to be gone: its offset is at or past the end of
        its partition in the log as it is now (the log was lost or restored from a copy)."""
        return self.offset is not None and self.partition is not None \
            and self.offset >= ends.get(self.partition, 0)


_ISSUED_COLUMNS = ("key, state, epoch, occurred_at, issued_at, attempts, command_id, "
                   "command_partition, command_offset")


class CommandLedger:
    """Per key: the last issued command. Written (and fsync'd) before the command is sent,
    so a crash in between delays a command by the command timeout but never doubles it;
    updated with the command's position once it is appended."""

    TABLES = ("issued",)

    def __init__(self, path: str | Path) -> None:
        self._file = _SqliteFile(path, """
            CREATE TABLE IF NOT EXISTS issued (
                key TEXT PRIMARY KEY, state TEXT NOT NULL, epoch INTEGER NOT NULL,
                occurred_at INTEGER NOT NULL, issued_at INTEGER NOT NULL,
                attempts INTEGER NOT NULL, command_id TEXT NOT NULL);
        """)
        columns = {str(row[1]) for row in self._file.execute("PRAGMA table_info(issued)")}
        for column in ("command_partition", "command_offset"):
            if column not in columns:  # a ledger from before positions were kept
                self._file.execute(f"ALTER TABLE issued ADD COLUMN {column} INTEGER")

    def bind(self, log: EventLog) -> None:
        """Record ``log``'s identity, or refuse (:class:`WrongLog`) a log with another one."""
        self._file.bind(log)

    def adopt(self, log: EventLog) -> None:
        """Forget every command issued into an earlier log; belong to ``log``."""
        self._file.adopt(log, self.TABLES)

    def get(self, key: str) -> Issued | None:
        rows = self._file.execute(f"SELECT {_ISSUED_COLUMNS} FROM issued WHERE key = ?", (key,))
        return _issued(rows[0]) if rows else None

    def tracked(self) -> list[str]:
        return [str(r[0]) for r in self._file.execute("SELECT key FROM issued ORDER BY key")]

    def put(self, issued: Issued) -> None:
        self._file.execute(
            f"INSERT OR REPLACE INTO issued ({_ISSUED_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (issued.key, issued.state, issued.epoch, issued.occurred_at, issued.issued_at,
             issued.attempts, issued.command_id, issued.partition, issued.offset))

    def forget(self, key: str) -> None:
        self._file.execute("DELETE FROM issued WHERE key = ?", (key,))

    def close(self) -> None:
        self._file.close()


def _issued(row: tuple[object, ...]) -> Issued:
    key, state, epoch, occurred_at, issued_at, attempts, command_id, partition, offset = row
    return Issued(str(key), str(state), int(str(epoch)), int(str(occurred_at)),
                  int(str(issued_at)), int(str(attempts)), str(command_id),
                  None if partition is None else int(str(partition)),
                  None if offset is None else int(str(offset)))


class OffsetStore:
    """Next offset to consume per (topic, partition), committed after each handled record."""

    TABLES = ("offsets",)

    def __init__(self, path: str | Path) -> None:
        self._file = _SqliteFile(path, """
            CREATE TABLE IF NOT EXISTS offsets (
                topic TEXT NOT NULL, partition INTEGER NOT NULL, next_offset INTEGER NOT NULL,
                PRIMARY KEY (topic, partition));
        """)

    def bind(self, log: EventLog) -> None:
        """Refuse (:class:`WrongLog`) a log with another identity, or whose commands topic
        ends before the stored offsets; record ``log``'s identity."""
        self._file.bind(log)
        stored = self.get(COMMANDS)
        if not stored:
            return
        ends = log.end_offsets(COMMANDS)
        for partition, offset in sorted(stored.items()):
            if offset > ends.get(partition, 0):
                raise WrongLog(f"{log.url} ends at offset {ends.get(partition, 0)} of commands "
                               f"partition {partition}, but {self._file.path} has consumed it up "
                               f"to offset {offset}: the log was truncated, replaced or restored "
                               f"from an older copy; {WrongLog.HINT}")

    def adopt(self, log: EventLog) -> None:
        """Start over on ``log``'s commands topic: forget the offsets of an earlier log."""
        self._file.adopt(log, self.TABLES)

    def get(self, topic: str) -> dict[int, int]:
        rows = self._file.execute("SELECT partition, next_offset FROM offsets WHERE topic = ?",
                                  (topic,))
        return {int(str(p)): int(str(o)) for p, o in rows}

    def commit(self, topic: str, partition: int, next_offset: int) -> None:
        self._file.execute("INSERT OR REPLACE INTO offsets VALUES (?, ?, ?)",
                           (topic, partition, next_offset))

    def close(self) -> None:
        self._file.close()


def adopt_log(state_dir: str | Path, log: EventLog) -> list[Path]:
    """Make the consumers' bookkeeping beside ``state_dir`` belong to ``log`` (what
    ``effectlog rebuild`` does): a file kept for another log, or for a longer one, is reset;
    one that fits ``log`` is kept. Files that do not exist are not created; returns the
    files reset."""
    reset = []
    for name, kind in (("recovery", CommandLedger), ("reconciler", OffsetStore)):
        path = consumer_db_path(state_dir, name)
        if not path.exists():
            continue
        store = kind(path)
        try:
            store.bind(log)
        except WrongLog:
            store.adopt(log)
            reset.append(path)
        finally:
            store.close()
    return reset
