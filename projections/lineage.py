"""Which log a projection was built from, and the refusal to mix it with another one.

Each partition's metadata column family holds the identity of the log it was projected
from (:meth:`effectlog.log.base.EventLog.identity`). Against a log with another identity,
or one that ends before the projection's stored offsets (truncated, or restored from an
older copy), the projection is refused with :class:`WrongLog` instead of silently being
continued from or re-read from zero. ``effectlog rebuild`` is how a projection adopts a
new log: it builds a fresh generation, which records the new identity.
"""

from __future__ import annotations

from collections.abc import Mapping

from rocksdict import Rdict

from effectlog.errors import WrongLog
from effectlog.log.base import EVENTS, EventLog

LOG_ID = b"log:id"


def stored_log_id(metadata: Rdict) -> str | None:
    """The log identity recorded in a partition's metadata family, if any."""
    raw = metadata.get(LOG_ID)
    return None if raw is None else bytes(raw).decode("utf-8", "replace")


def bind(metadata: Rdict, log: EventLog, partition: int, next_offset: int,
         where: str) -> None:
    """Check one partition opened for writing against ``log``; record the log's identity
    when the partition has none yet (a new projection, or one from before identities)."""
    stored = stored_log_id(metadata)
    check(log, {partition: (stored, next_offset)}, where)
    identity = log.identity()
    if stored is None and identity is not None:
        metadata[LOG_ID] = identity.encode("utf-8")


def check(log: EventLog, claims: Mapping[int, tuple[str | None, int]], where: str,
          ends: Mapping[int, int] | None = None) -> None:
    """Raise :class:`WrongLog` unless every partition of ``claims`` (partition -> (stored
    log identity, next offset)) can continue on ``log``."""
    identity = log.identity()
    ends = log.end_offsets(EVENTS) if ends is None else ends
    for partition, (stored, next_offset) in sorted(claims.items()):
        if stored is not None and identity is not None and stored != identity:
            raise WrongLog(f"{where} was built from log {stored}, but {log.url} is log "
                           f"{identity}: {WrongLog.HINT}")
        end = ends.get(partition)
        if next_offset > (end or 0):
            found = "has no partition" if end is None else f"ends at offset {end} of partition"
            raise WrongLog(f"{log.url} {found} {partition}, but {where} has applied it up to "
                           f"offset {next_offset}: the log was truncated, replaced or restored "
                           f"from an older copy; {WrongLog.HINT}")
