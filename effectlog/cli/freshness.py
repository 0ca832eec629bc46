"""Reads that reflect writes: ``get``, ``list`` and ``stats`` catch the projection up with the
embedded (SQLite) log before they read it.

Knowing whether there is anything to do is cheap and creates nothing: the log's end is read
through the stdlib's SQLite module in read-only mode, the projection's next offset from its
offsets column family. Only when the projection is behind does a read run the projector,
within a time budget. Where another process (``effectlog project`` or ``serve``) holds the
projection's writer lock, the read waits a moment for that projector; if events are still
missing, it says in one line how far behind the projection is and shows it as it is.
Other logs (Kafka) are projected by ``serve``; reads there never touch the broker.
"""

from __future__ import annotations

import os
import sys
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from effectlog.cli.context import CliContext
    from projections.projector import Progress

_SQLITE = "sqlite:///"
_EVENTS_TABLE = "events"  # the SQLite log's table of the events topic (effectlog.log.sqlite)
_META_TABLE = "meta"  # where it keeps its identity


def sqlite_log_end(log_url: str) -> tuple[int, str | None] | None:
    """The end offset of the events topic of the SQLite log at ``log_url`` (records so far)
    and the log's identity, or None when the URL is not a SQLite one or no readable log is
    there.

    Opened read-only; where no write-ahead log exists (no writer has the file open) also
    ``immutable``, so that not even SQLite's ``-wal``/``-shm`` files are created.
    """
    if not log_url.startswith(_SQLITE):
        return None
    path = log_url[len(_SQLITE):].split("?", 1)[0]
    if not path or not os.path.isfile(path):
        return None
    # The C module behind sqlite3 (same connect, same errors): `import sqlite3` also loads
    # datetime for its adapters, 2-3 ms of the 20 or so that `get KEY --json` may add.
    import _sqlite3 as sqlite
    from urllib.parse import quote

    flags = "mode=ro" if os.path.exists(path + "-wal") else "mode=ro&immutable=1"
    try:
        db = sqlite.connect(f"file:{quote(os.path.abspath(path))}?{flags}", uri=True)
        try:
            row = db.execute(f"SELECT MAX(rowid) FROM {_EVENTS_TABLE}").fetchone()
            try:
                ident = db.execute(f"SELECT value FROM {_META_TABLE} "
                                   "WHERE name = 'log_id'").fetchone()
            except sqlite.Error:  # a log from before identities
                ident = None
        finally:
            db.close()
    except sqlite.Error:
        return None
    return int(row[0] or 0), None if ident is None else str(ident[0])


def lag(log_url: str, next_offsets: dict[int, int], log_ids: dict[int, str | None],
        where: str) -> int | None:
    """Events in the log not yet projected, or None when that cannot be told cheaply (not a
    SQLite log). Raises :class:`WrongLog` when the SQLite log is gone, is another log than
    the projection was built from (``log_ids``), or ends before it (exit 4, as every command
    that opens the log says), and :class:`InvalidInput` for a URL no backend takes."""
    from effectlog.errors import WrongLog

    if not log_url.startswith(_SQLITE):
        from effectlog.log import check_log_url

        check_log_url(log_url)
        return None
    found = sqlite_log_end(log_url)
    built = ", ".join(sorted({i for i in log_ids.values() if i})) or "another log"
    if found is None:
        raise WrongLog(f"no readable sqlite log at {log_url[len(_SQLITE):]}, but {where} was "
                       f"built from log {built}: {WrongLog.HINT}")
    end, identity = found
    if identity is not None and any(i not in (None, identity) for i in log_ids.values()):
        raise WrongLog(f"{where} was built from log {built}, but {log_url} is log "
                       f"{identity}: {WrongLog.HINT}")
    applied = next_offsets.get(0, 0)
    if end < applied:
        raise WrongLog(f"{log_url} ends at offset {end} of partition 0, but {where} has "
                       f"applied it up to offset {applied}: the log was truncated, replaced "
                       f"or restored from an older copy; {WrongLog.HINT}")
    return end - applied


def catch_up(obj: CliContext, applied: int, end: int) -> None:
    """Bring the projection from the ``applied`` offset to the log's ``end``: project the
    difference here within ``obj.timeout_s``, or, where another projector holds the
    projection, wait up to :data:`OTHER_PROJECTOR_WAIT_S` for it to get there. Whatever is
    left is said in one line on stderr, and the read goes on with the projection as it is."""
    from projections.rocksdb.db import ProjectionLocked

    try:
        left = _project(obj, end - applied)
    except ProjectionLocked:
        left = _wait_for_other_projector(obj, end)
        if left > 0:
            note(f"the projection is {left} event(s) behind the log: another process "
                 "(effectlog project or serve) is projecting it; showing it as it is")
        return
    if left > 0:
        note(f"the projection is still {left} event(s) behind the log after catching up for "
             f"{obj.timeout_s:g}s; showing it as it is (effectlog project catches up)")


#: How long a read waits for a running ``project`` or ``serve`` to apply what it must show.
OTHER_PROJECTOR_WAIT_S = 2.0


def _project(obj: CliContext, behind: int) -> int:
    """Run the projector up to the log's current end within the timeout; events left."""
    import threading

    from projections.projector import Projector

    stop = threading.Event()
    deadline = time.monotonic() + obj.timeout_s
    log = obj.open_log()
    try:
        with Projector(log, obj.state_dir) as projector, _Bar(behind) as bar:
            def on_progress(progress: Progress) -> None:
                bar.update(progress.records)
                if time.monotonic() >= deadline:
                    stop.set()

            return projector.run(once=True, stop=stop, on_progress=on_progress).total_lag
    finally:
        log.close()


def _wait_for_other_projector(obj: CliContext, end: int) -> int:
    """Poll the stored offset until the other projector reached ``end`` (or the wait is
    over); events still missing."""
    from projections import open_reader

    def applied() -> int:
        reader = open_reader(obj.state_dir, families=("state", "offsets"))
        try:
            return reader.next_offsets().get(0, 0)
        finally:
            reader.close()

    deadline = time.monotonic() + min(obj.timeout_s, OTHER_PROJECTOR_WAIT_S)
    while True:
        left = end - applied()
        if left <= 0 or time.monotonic() >= deadline:
            return max(0, left)
        time.sleep(0.02)


def note(text: str) -> None:
    """One line on stderr."""
    sys.stderr.write(f"note: {text}\n")


class _Bar:
    """A transient rich progress bar on stderr while catching up (terminal only)."""

    def __init__(self, total: int) -> None:
        self._total = total
        self._bar = None
        if sys.stderr.isatty():
            from rich.console import Console
            from rich.progress import Progress

            self._bar = Progress(console=Console(stderr=True), transient=True)
            self._task = self._bar.add_task("catching up with the log", total=total)

    def __enter__(self) -> _Bar:
        if self._bar is not None:
            self._bar.start()
        return self

    def update(self, done: int) -> None:
        if self._bar is not None:
            self._bar.update(self._task, completed=min(done, self._total))

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()
