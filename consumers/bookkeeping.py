"""Durable bookkeeping of the consumers in small SQLite files under the state directory.

:class:`CommandLedger` remembers which reconciliation commands are outstanding (so a
restarted recovery consumer does not issue a second one); :class:`OffsetStore` keeps the
reconciler's consumed offsets of the commands topic.
"""

from __future__ import annotations

import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path

from effectlog.errors import BackendUnavailable


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
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            self._db = sqlite3.connect(self.path, timeout=30.0, isolation_level=None,
                                       check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.executescript(schema)
        except (sqlite3.Error, OSError) as exc:
            raise BackendUnavailable(f"cannot open {self.path}: {exc}") from exc

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
    """The last command issued for a key and the snapshot it was issued for."""

    key: str
    state: str
    epoch: int
    occurred_at: int
    issued_at: int
    attempts: int
    command_id: str

    def same_snapshot(self, state: str, epoch: int, occurred_at: int) -> bool:
        return (self.state, self.epoch, self.occurred_at) == (state, epoch, occurred_at)


class CommandLedger:
    """Per key: the last issued command. Written (and fsync'd) before the command is sent,
    so a crash in between delays a command by the command timeout but never doubles it."""

    def __init__(self, path: str | Path) -> None:
        self._file = _SqliteFile(path, """
            CREATE TABLE IF NOT EXISTS issued (
                key TEXT PRIMARY KEY, state TEXT NOT NULL, epoch INTEGER NOT NULL,
                occurred_at INTEGER NOT NULL, issued_at INTEGER NOT NULL,
                attempts INTEGER NOT NULL, command_id TEXT NOT NULL);
        """)

    def get(self, key: str) -> Issued | None:
        rows = self._file.execute("SELECT key, state, epoch, occurred_at, issued_at, attempts, "
                                  "command_id FROM issued WHERE key = ?", (key,))
        return _issued(rows[0]) if rows else None

    def tracked(self) -> list[str]:
        return [str(r[0]) for r in self._file.execute("SELECT key FROM issued ORDER BY key")]

    def put(self, issued: Issued) -> None:
        self._file.execute(
            "INSERT OR REPLACE INTO issued VALUES (?, ?, ?, ?, ?, ?, ?)",
            (issued.key, issued.state, issued.epoch, issued.occurred_at, issued.issued_at,
             issued.attempts, issued.command_id))

    def forget(self, key: str) -> None:
        self._file.execute("DELETE FROM issued WHERE key = ?", (key,))

    def close(self) -> None:
        self._file.close()


def _issued(row: tuple[object, ...]) -> Issued:
    key, state, epoch, occurred_at, issued_at, attempts, command_id = row
    return Issued(str(key), str(state), int(str(epoch)), int(str(occurred_at)),
                  int(str(issued_at)), int(str(attempts)), str(command_id))


class OffsetStore:
    """Next offset to consume per (topic, partition), committed after each handled record."""

    def __init__(self, path: str | Path) -> None:
        self._file = _SqliteFile(path, """
            CREATE TABLE IF NOT EXISTS offsets (
                topic TEXT NOT NULL, partition INTEGER NOT NULL, next_offset INTEGER NOT NULL,
                PRIMARY KEY (topic, partition));
        """)

    def get(self, topic: str) -> dict[int, int]:
        rows = self._file.execute("SELECT partition, next_offset FROM offsets WHERE topic = ?",
                                  (topic,))
        return {int(str(p)): int(str(o)) for p, o in rows}

    def commit(self, topic: str, partition: int, next_offset: int) -> None:
        self._file.execute("INSERT OR REPLACE INTO offsets VALUES (?, ?, ?)",
                           (topic, partition, next_offset))

    def close(self) -> None:
        self._file.close()
