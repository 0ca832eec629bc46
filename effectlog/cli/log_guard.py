"""Opening the log a command names, checked against the state built from it.

The state under ``--state`` (the projection, and the consumers' bookkeeping beside it)
claims the log it was built from. A command that uses both refuses, with one line and
exit 4 and before writing anything, a log that is missing, has another identity, or ends
before the projection's stored offsets (:class:`WrongLog`). Only a command that creates an
effect may create a log, and only where no state claims one. ``effectlog rebuild`` opens
the log without the claim: it is how the state adopts a new log.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from effectlog.errors import LogMissing, WrongLog

if TYPE_CHECKING:
    from effectlog.log.base import EventLog

Claims = dict[int, tuple[str | None, int]]  # partition -> (log identity, next offset)


def projection_claims(state_dir: str) -> Claims:
    """What the projection under ``state_dir`` claims, read without writing anything."""
    from projections.rocksdb import layout

    if layout.current_generation(state_dir) is None:
        return {}
    from projections import open_reader

    reader = open_reader(state_dir, families=("state", "offsets", "metadata"))
    try:
        ids, nexts = reader.log_ids(), reader.next_offsets()
    finally:
        reader.close()
    return {p: (ids.get(p), nexts.get(p, 0)) for p in sorted(set(ids) | set(nexts))}


def bookkeeping_exists(state_dir: str) -> bool:
    """Whether recovery or the reconciler kept bookkeeping for some log beside ``state_dir``."""
    from consumers.bookkeeping import consumer_db_path

    return any(consumer_db_path(state_dir, name).exists() for name in ("recovery", "reconciler"))


def open_checked(log_url: str, state_dir: str, *, create: bool = False,
                 against_state: bool = True) -> EventLog:
    """Open ``log_url``; with ``against_state``, refuse a log the state does not belong to.

    ``create`` lets a missing log be created, unless the state claims one.
    """
    from effectlog.log import open_log

    claims = projection_claims(state_dir) if against_state else {}
    claimed = bool(claims) or (against_state and bookkeeping_exists(state_dir))
    where = f"the state under {Path(state_dir).absolute()}"
    try:
        log = open_log(log_url, create=create and not claimed)
    except LogMissing as exc:
        if not claimed:
            raise
        ids = sorted({i for i, _ in claims.values() if i is not None})
        built = f"log {', '.join(ids)}" if ids else "another log"
        raise WrongLog(f"{exc}, but {where} was built from {built}: restore it or point --log "
                       "at it (`effectlog rebuild` adopts a new log)") from None
    if claims:
        from projections.lineage import check

        try:
            check(log, claims, where)
        except BaseException:
            log.close()
            raise
    return log
