"""The bundled fake provider: results by key in one SQLite file, shared by processes.

It behaves like a good idempotent API (same key + same payload returns the original result;
another payload, target or operation under the key is refused; a lower fencing epoch than
seen is refused) and counts how often each effect was really performed, so tests can
assert one logical effect per operation. Faults are stored in the file too, so a test can
inject them into a worker running in another process:

- accept-then-timeout: the effect is performed, then :class:`ProviderTimeout` is raised;
- lookup outages: the next N lookups (of every key, or of one) answer UNAVAILABLE;
- execute outages: the next N calls raise :class:`ProviderUnavailable` without performing;
- slowness: every call answers ``latency_s`` late; a duplicate arriving meanwhile gets a
  :class:`ProviderConflict` (in flight), and lookups answer UNAVAILABLE until it is done.

A payload ``{"_fake_fail": "reason"}`` is refused definitively (:class:`ProviderFailed`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from consumers.providers.wire import operation_of
from effectlog.errors import BackendUnavailable, InvalidInput
from effectlog.model import Outcome, State
from effectlog.private_fs import create_private_file, make_private_dirs
from effectlog.provider import (
    FencedByProvider,
    LookupResult,
    LookupStatus,
    ProviderConflict,
    ProviderFailed,
    ProviderTimeout,
    ProviderUnavailable,
)

logger = logging.getLogger(__name__)

DEFAULT_RETENTION_S = 30 * 24 * 3600.0
_SCHEMA = """
CREATE TABLE IF NOT EXISTS effects (
    key TEXT PRIMARY KEY, operation TEXT NOT NULL, target TEXT NOT NULL,
    payload_hash TEXT NOT NULL, status TEXT NOT NULL, result_json TEXT NOT NULL,
    executions INTEGER NOT NULL, calls INTEGER NOT NULL, max_epoch INTEGER NOT NULL,
    ready_at REAL NOT NULL, created_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS faults (name TEXT PRIMARY KEY, value REAL NOT NULL);
"""
_COLUMNS = ("key, operation, target, payload_hash, status, result_json, executions, calls, "
            "max_epoch, ready_at")


class KeyReused(ProviderConflict):
    """The key was used before with another payload, target or operation (HTTP 422)."""


class InFlight(ProviderConflict):
    """A request with the same key is still being processed (HTTP 409)."""


class FakeProvider:
    """A durable, fault-injectable provider; every instance on one file sees the same state."""

    def __init__(self, path: str | Path, *, lookup_complete: bool = True, dedupe: bool = True,
                 retention_s: float = DEFAULT_RETENTION_S) -> None:
        self.path = Path(path)
        self.lookup_complete = lookup_complete
        self.dedupe = dedupe  # False: a naive API that performs every call (for comparisons)
        self.retention_s = retention_s
        self._lock = threading.Lock()
        try:
            make_private_dirs(self.path.parent)
            create_private_file(self.path)
            self._db = sqlite3.connect(self.path, timeout=30.0, isolation_level=None,
                                       check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.executescript(_SCHEMA)
        except (sqlite3.Error, OSError) as exc:
            raise BackendUnavailable(f"cannot open the fake provider's {self.path}: {exc}") from exc

    @classmethod
    def from_url(cls, url: str) -> FakeProvider:
        """``fake:///abs/path.db?lookup_complete=0&dedupe=0&retention_s=60``."""
        rest = url.split("://", 1)[1] if "://" in url else url
        path, _, query = rest.partition("?")
        check_db_path(path, f"fake provider URL {url!r}")  # before any file is made
        opts = dict(part.split("=", 1) for part in query.split("&") if "=" in part)
        flag = {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False}
        try:
            return cls(path, lookup_complete=flag[opts.get("lookup_complete", "1").lower()],
                       dedupe=flag[opts.get("dedupe", "1").lower()],
                       retention_s=float(opts.get("retention_s", DEFAULT_RETENTION_S)))
        except (KeyError, ValueError) as exc:
            raise InvalidInput(f"bad fake provider URL {url!r}: {exc}") from exc

    def reopen(self) -> FakeProvider:
        """A new instance on the same file (as after a provider restart)."""
        return FakeProvider(self.path, lookup_complete=self.lookup_complete, dedupe=self.dedupe,
                            retention_s=self.retention_s)

    # -- the provider contract -----------------------------------------------------------

    def execute(self, target: str, payload_hash: str, idempotency_key: str,
                fencing_epoch: int, payload: Any) -> Any:
        """Perform the effect at most once per key; the operation type is the key's kind."""
        return self.execute_operation(operation_of(idempotency_key), target, payload_hash,
                                      idempotency_key, fencing_epoch, payload)

    def execute_operation(self, operation: str, target: str, payload_hash: str,
                          idempotency_key: str, fencing_epoch: int, payload: Any) -> Any:
        """:meth:`execute` with the operation type given explicitly (as an HTTP path is)."""
        now = time.time()
        with self._txn() as db:
            if self._take_fault(db, "execute_unavailable"):
                raise ProviderUnavailable("fake provider: injected outage")
            row = db.execute(f"SELECT {_COLUMNS} FROM effects WHERE key = ?",
                             (idempotency_key,)).fetchone()
            if row is not None:
                early = self._check_existing(db, row, operation, target, payload_hash,
                                             fencing_epoch, now)
                if early is not None:
                    return _replay(early)
            status, result = _perform(target, idempotency_key, fencing_epoch, payload)
            latency = self._fault(db, "latency_s")
            timeout = self._take_fault(db, "timeout_after_accept")
            db.execute(
                "INSERT INTO effects VALUES (?, ?, ?, ?, ?, ?, 1, 1, ?, ?, ?) ON CONFLICT(key) DO "
                "UPDATE SET status = excluded.status, result_json = excluded.result_json, "
                "executions = executions + 1, max_epoch = excluded.max_epoch, "
                "ready_at = excluded.ready_at",
                (idempotency_key, operation, target, payload_hash, status,
                 json.dumps(result, sort_keys=True), fencing_epoch, now + latency, now))
        logger.debug("fake provider performed %s (epoch %d)", idempotency_key, fencing_epoch)
        if latency:
            time.sleep(latency)
        if timeout:
            raise ProviderTimeout("fake provider: performed, then timed out (injected)")
        return _replay((status, result))

    def lookup(self, idempotency_key: str) -> LookupResult:
        """CONFIRMED with the stored outcome, NOT_FOUND, or UNAVAILABLE (outage, in flight)."""
        with self._txn() as db:
            if self._take_fault(db, f"lookup_outage:{idempotency_key}") \
                    or self._take_fault(db, "lookup_outage"):
                return LookupResult(LookupStatus.UNAVAILABLE, detail="injected lookup outage")
            row = db.execute(f"SELECT {_COLUMNS} FROM effects WHERE key = ?",
                             (idempotency_key,)).fetchone()
        if row is None:
            return LookupResult(LookupStatus.NOT_FOUND)
        if float(row[9]) > time.time():
            return LookupResult(LookupStatus.UNAVAILABLE, detail="request still in flight")
        outcome = Outcome(State(row[4]), json.loads(row[5]), "lookup")
        return LookupResult(LookupStatus.CONFIRMED, outcome, payload_hash=str(row[3]))

    # -- fault injection and inspection --------------------------------------------------

    def inject_timeout_after_accept(self, count: int = 1) -> None:
        """The next ``count`` performed calls raise ProviderTimeout after performing."""
        self._set_fault("timeout_after_accept", count)

    def inject_lookup_outage(self, count: int, key: str | None = None) -> None:
        """The next ``count`` lookups (of ``key`` only, when given) answer UNAVAILABLE."""
        self._set_fault("lookup_outage" if key is None else f"lookup_outage:{key}", count)

    def inject_execute_outage(self, count: int) -> None:
        """The next ``count`` calls raise ProviderUnavailable without performing."""
        self._set_fault("execute_unavailable", count)

    def set_latency(self, seconds: float) -> None:
        """Answer every call ``seconds`` late (the effect is performed at once)."""
        self._set_fault("latency_s", seconds)

    def executions(self, idempotency_key: str) -> int:
        """How many times the effect under this key was really performed."""
        row = self._query("SELECT executions FROM effects WHERE key = ?", (idempotency_key,))
        return int(row[0][0]) if row else 0

    def calls(self, idempotency_key: str) -> int:
        """How many calls arrived for this key (performed or not)."""
        row = self._query("SELECT calls FROM effects WHERE key = ?", (idempotency_key,))
        return int(row[0][0]) if row else 0

    def total_executions(self) -> int:
        return int(self._query("SELECT COALESCE(SUM(executions), 0) FROM effects", ())[0][0])

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # -- internals -----------------------------------------------------------------------

    def _check_existing(self, db: sqlite3.Connection, row: tuple[Any, ...], operation: str,
                        target: str, payload_hash: str, epoch: int,
                        now: float) -> tuple[str, Any] | None:
        """Refuse or replay a call for a key seen before; None lets it perform again."""
        key, seen_operation, seen_target, seen_hash, status, result_json = row[:6]
        max_epoch, ready_at = int(row[8]), float(row[9])
        db.execute("UPDATE effects SET calls = calls + 1 WHERE key = ?", (key,))
        if epoch < max_epoch:
            raise FencedByProvider(f"epoch {epoch} is below epoch {max_epoch} seen for {key}")
        db.execute("UPDATE effects SET max_epoch = ? WHERE key = ?", (epoch, key))
        if (seen_operation, seen_target) != (operation, target):
            raise KeyReused(f"key {key} was used for {seen_operation or '?'} on "
                                   f"{seen_target}, not {operation or '?'} on {target}")
        if seen_hash != payload_hash:
            raise KeyReused(f"key {key} was used with another payload")
        if ready_at > now:
            raise InFlight(f"a request with key {key} is still in flight")
        if not self.dedupe:
            return None
        return str(status), json.loads(result_json)

    @contextmanager
    def _txn(self) -> Iterator[sqlite3.Connection]:
        """A write transaction; SQLite's lock makes it atomic across processes too."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException as exc:
                if isinstance(exc, FencedByProvider | ProviderConflict | ProviderUnavailable):
                    self._db.execute("COMMIT")  # keep the call count and epoch it saw
                else:
                    self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def _fault(self, db: sqlite3.Connection, name: str) -> float:
        row = db.execute("SELECT value FROM faults WHERE name = ?", (name,)).fetchone()
        return float(row[0]) if row else 0.0

    def _take_fault(self, db: sqlite3.Connection, name: str) -> bool:
        """Consume one occurrence of a counted fault."""
        if self._fault(db, name) < 1:
            return False
        db.execute("UPDATE faults SET value = value - 1 WHERE name = ?", (name,))
        return True

    def _set_fault(self, name: str, value: float) -> None:
        with self._txn() as db:
            db.execute("INSERT OR REPLACE INTO faults VALUES (?, ?)", (name, float(value)))

    def _query(self, sql: str, args: tuple[object, ...]) -> list[tuple[Any, ...]]:
        with self._lock:
            return self._db.execute(sql, args).fetchall()


def check_db_path(path: str, what: str) -> Path:
    """``path`` as a file the fake may create: named, not a directory, in a directory that
    exists (a mistyped path is refused, never made into a tree of directories)."""
    if not path.strip():
        raise InvalidInput(f"{what}: no file named")
    file = Path(path)
    if file.is_dir():
        raise InvalidInput(f"{what}: {path} is a directory, not a database file")
    parent = file.parent
    if not parent.is_dir():
        raise InvalidInput(f"{what}: directory {parent} does not exist (create it first)")
    return file


def _perform(target: str, key: str, epoch: int, payload: Any) -> tuple[str, Any]:
    """The fake effect: a stable receipt, or a definitive failure when asked for one."""
    if isinstance(payload, dict) and payload.get("_fake_fail"):
        return State.FAILED.value, {"error": str(payload["_fake_fail"])}
    receipt = "fx-" + hashlib.sha256(key.encode("utf-8")).hexdigest()[:16]
    return State.SUCCEEDED.value, {"id": receipt, "target": target, "epoch": epoch}


def _replay(stored: tuple[str, Any]) -> Any:
    status, result = stored
    if status == State.FAILED.value:
        raise ProviderFailed(f"fake provider refused: {result}", result)
    return result
