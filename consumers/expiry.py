"""Expiry of settled effects: keeps the log and the projection bounded.

An effect that reached SUCCEEDED, FAILED or ABANDONED can change no more; after the retention
it is expired by a tombstone on the events topic (:meth:`EventLog.expire`). The projector
judges a tombstone like any record (:func:`effectlog.machine.check_expiry`): it removes a
settled key (state, index entry, counted as ``expired``) and is rejected for an open or
unknown one, so whoever writes it, the state stays what a replay gives. Each tombstone names
the effect it expires (:data:`Expiring`), so one of two expirers that picked the same effect
never removes the effect the key holds after it was used again. A key used again
after it expired is a new effect. Kafka's compaction then drops the key's older records
and, after ``delete.retention.ms``, the tombstone itself; on SQLite :meth:`EventLog.purge_expired`
deletes the older records once the tombstone is older than ``purge_after_s``, and keeps the
tombstone as a purge mark, which a projection that lagged behind the purge applies too.

Candidates come from the projection's state/time index (settled states, logged before the
cutoff), never from a scan of the log.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from effectlog.errors import BackendUnavailable, InvalidInput
from effectlog.log.base import EventLog
from effectlog.machine import SETTLED
from effectlog.model import now_ms
from projections.store import ProjectionReader

logger = logging.getLogger(__name__)

#: Settled states in a fixed order (scanned one after the other).
SETTLED_STATES = tuple(sorted(SETTLED, key=lambda s: s.value))
DAY_S = 86_400.0


@dataclass(frozen=True, slots=True)
class ExpirySettings:
    """How long settled effects are kept (``retention_s``), how long their tombstones and
    older records stay on a log that is not compacted by a broker (``purge_after_s``), how
    many keys one pass expires and how often ``serve`` runs a pass."""

    retention_s: float
    purge_after_s: float = DAY_S
    batch: int = 10_000
    every_s: float | None = None  # default: a tenth of the retention, 1 s to 60 s

    def __post_init__(self) -> None:
        if self.retention_s < 0 or self.purge_after_s < 0 or self.batch < 1:
            raise InvalidInput("expiry needs a non-negative retention and purge delay and a "
                               "batch of at least 1")

    @property
    def interval_s(self) -> float:
        if self.every_s is not None:
            return self.every_s
        return min(60.0, max(1.0, self.retention_s / 10))


@dataclass(frozen=True, slots=True)
class ExpiryPass:
    """What one pass did: the keys it expired (tombstones written) and the rows it purged."""

    expired: list[str]
    purged: int


#: A settled effect to expire: its key, and the event id of its last accepted event (what
#: its tombstone names, so that it expires this effect and never one the key holds later).
Expiring = tuple[str, str]


def expiring(reader: ProjectionReader, before_ms: int, limit: int) -> list[Expiring]:
    """Settled effects whose last transition was logged before ``before_ms``, at most
    ``limit`` (oldest first within each state)."""
    found: list[Expiring] = []
    for state in SETTLED_STATES:
        if len(found) >= limit:
            break
        for logged in reader.scan_logged(state, older_than_ms=before_ms,
                                         limit=limit - len(found)):
            found.append((logged.event.idempotency_key, logged.event.event_id))
    return found


def expire_pass(log: EventLog, effects: Sequence[Expiring], settings: ExpirySettings,
                now: int | None = None) -> ExpiryPass:
    """Tombstone ``effects`` and purge what the log keeps past ``purge_after_s``."""
    at = now_ms() if now is None else now
    written = log.expire(effects) if effects else {}
    purged = log.purge_expired(at - int(settings.purge_after_s * 1000))
    return ExpiryPass(list(written), purged)


class Expirer:
    """``serve``'s expiry loop over the partitions it serves.

    After a pass it waits until the projector has applied its tombstones before the next
    one, so a key is never tombstoned twice (a second tombstone could land after the key
    was used again, where it would be rejected but still make compaction drop the new
    effect's records).
    """

    def __init__(self, log: EventLog, reader: ProjectionReader, settings: ExpirySettings,
                 applied: Callable[[], dict[int, int]]) -> None:
        self.log = log
        self.reader = reader
        self.settings = settings
        self.applied = applied
        self._pending: dict[int, int] = {}  # partition -> offset its tombstones reach

    def run_once(self) -> ExpiryPass | None:
        """One pass; None while the previous pass's tombstones are not applied yet."""
        applied = self.applied()  # the partitions held here (a moved one is its new owner's)
        if any(p in applied and applied[p] < end for p, end in self._pending.items()):
            return None
        self._pending.clear()
        now = now_ms()
        effects = expiring(self.reader, now - int(self.settings.retention_s * 1000),
                           self.settings.batch)
        written = self.log.expire(effects) if effects else {}
        keys = list(written)
        for position in written.values():
            end = position.offset + 1
            if end > self._pending.get(position.partition, 0):
                self._pending[position.partition] = end
        purged = self.log.purge_expired(now - int(self.settings.purge_after_s * 1000))
        if keys or purged:
            logger.info("expired %d settled effects older than %gs (purged %d records)",
                        len(keys), self.settings.retention_s, purged,
                        extra={"expired": len(keys), "purged": purged})
        return ExpiryPass(keys, purged)

    def run(self, stop: threading.Event) -> None:
        """Passes every ``interval_s`` until ``stop``; an unreachable log is retried."""
        while not stop.is_set():
            started = time.monotonic()
            try:
                self.run_once()
            except BackendUnavailable as exc:
                logger.warning("expiry pass failed (retried): %s", exc)
            stop.wait(max(0.0, self.settings.interval_s - (time.monotonic() - started)))

