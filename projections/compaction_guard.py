"""The compaction guard: a projection never applies records past a stretch compaction may have thinned.

On a compacted events topic, Kafka's cleaner may remove a record once a later record of the
same key exists and the record is older than ``min.compaction.lag.ms``. A projection equals a
full replay only if it applies every record after the point it starts from (its own copy's
offset, or the changelog's last checkpoint). Normally it does: the owner publishes every second
and serve refuses a lag under 10 s (the default is the reconciliation window, 7 days). A
projection that starts from a point older than the lag (serve down that long, a partition left
unpublished that long) may find records gone, and applying the survivors gives states a full
replay never had: a key whose CREATE to DISPATCH were removed, and whose RECORD survived, would
read as absent, and a new delivery of it would be called again.

So every batch is checked, at nearly no cost. Offsets between delivered records that hold no
readable record are a *gap*. A gap is harmless when the record before it is younger than the
lag (less a margin for the clocks of this host and the brokers): everything after that record
is younger still, so nothing there can have been removed. A gap after an older record may be
compaction (transaction markers and aborted records look the same to a reader), and the
partition is *halted* before it: its state stays exactly what was applied below the gap, and
nothing past the gap is applied or judged. The end of what a source can read is judged the same
way: compaction removes a record there only behind a later tombstone of its key, and the
tombstone itself after ``delete.retention.ms``, so a key's whole history can vanish from the
end. One empty offset there is harmless (a commit marker, or a lone tombstone whose removal
leaves its key as it was); more, after an old record, halt the partition.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from effectlog.errors import Conflict
from effectlog.log.base import EVENTS, EventLog, Record

logger = logging.getLogger(__name__)

#: Called when a partition halts: (partition, why, in one line).
HaltCallback = Callable[[int, str], None]
#: At most this much of the lag is set aside for the clocks of this host and the brokers.
MAX_MARGIN_MS = 60_000


class CompactionGap(Conflict):
    """Records the projection needs may have been compacted away (exit 3)."""

    reason = "compaction_gap"


@dataclass(frozen=True, slots=True)
class _Mark:
    """Everything up to ``offset`` was checked; every later record is no older than
    ``timestamp_ms`` (None: not known yet)."""

    offset: int
    timestamp_ms: int | None


class CompactionGuard:
    """Checks each partition's records for gaps compaction may have made (see the module).

    ``on_halt`` hears of a halted partition; without one, :class:`CompactionGap` is raised.
    ``accept`` logs a gap and applies past it anyway (``--accept-compaction-gaps``).
    ``lag_ms``: the events topic's ``min.compaction.lag.ms`` (asked of ``log`` when not
    given; None: never compacted, nothing to guard)."""

    def __init__(self, log: EventLog, *, on_halt: HaltCallback | None = None,
                 accept: bool = False, lag_ms: int | None = None,
                 clock_ms: Callable[[], int] | None = None) -> None:
        self.log = log
        self.on_halt = on_halt
        self.accept = accept
        # asked now, not inside a rebalance callback, where a slow broker would hold it up
        self.lag_ms = lag_ms if lag_ms is not None or not log.compacted else \
            log.compaction_lag_ms()
        self._clock_ms = clock_ms or (lambda: int(time.time() * 1000))
        self._marks: dict[int, _Mark] = {}
        self._halted: dict[int, str] = {}
        self._caught_up: set[int] = set()  # reached their end since they started here
        self._newest = 0  # the newest record time read: the brokers' clock is at least there

    def lag_read(self, lag_ms: int | None) -> None:
        """The topic's ``min.compaction.lag.ms`` as read again now (any thread): a lower one
        (or a first one: the topic is compacted now) applies at once, to the partitions started
        from then on too; a higher one never does, since what the cleaner removed under the
        lower one stays removed (and None, no longer compacted, changes nothing)."""
        if lag_ms is None or (self.lag_ms is not None and lag_ms >= self.lag_ms):
            return
        logger.warning("the events topic's min.compaction.lag.ms is now %d ms (was %s): gaps "
                       "are judged by it from now on", lag_ms,
                       "not compacted" if self.lag_ms is None else f"{self.lag_ms} ms")
        self.lag_ms = lag_ms

    def start(self, partition: int, next_offset: int) -> None:
        """``partition`` resumes at ``next_offset``: the records below it were applied."""
        self._halted.pop(partition, None)
        self._caught_up.discard(partition)
        if self.lag_ms is not None:
            self._marks[partition] = _Mark(next_offset - 1, None)

    def forget(self, partition: int) -> None:
        self._marks.pop(partition, None)
        self._halted.pop(partition, None)
        self._caught_up.discard(partition)

    def halted(self) -> dict[int, str]:
        """The halted partitions, with why."""
        return dict(self._halted)

    def admit(self, partition: int, records: list[Record]) -> list[Record]:
        """The records of ``partition`` (in offset order) that may be applied: all of them,
        or those before a gap that halts it."""
        mark = self._marks.get(partition)
        if mark is None or not records or records[-1].offset <= mark.offset:
            return records  # not guarded here, or read again (checked already)
        if partition in self._halted:
            return [r for r in records if r.offset <= mark.offset]
        self._newest = max(self._newest, records[-1].timestamp_ms)
        oldest_safe = self._oldest_safe()
        for index, record in enumerate(records):
            if mark.timestamp_ms is not None and mark.timestamp_ms > oldest_safe:
                break  # this record and all after it are too young to have been removed
            if record.offset <= mark.offset:
                continue
            if record.offset > mark.offset + 1:
                stamp = self._stamp(partition, mark)
                if (stamp is None or stamp <= oldest_safe) and \
                        not self._gap(partition, mark.offset + 1, record.offset, stamp):
                    self._marks[partition] = mark
                    return records[:index]
            mark = _Mark(record.offset, record.timestamp_ms)
        last = records[-1]
        self._marks[partition] = _Mark(last.offset, last.timestamp_ms)
        return records

    def reached(self, partition: int, offset: int) -> bool:
        """Whether ``partition`` may move its offset to ``offset``, the end of what could be
        read: the offsets before it hold no readable record. One such offset is a commit
        marker, or a lone tombstone whose removal leaves its key as it was; more after an old
        record may be a key's whole history, removed behind its tombstone: a gap (see above).
        Only the first end reached after :meth:`start` is judged so: what appears past an end
        the projector has reached, it reads as it comes (an aborted transaction of a worker
        killed mid-write, on a partition idle for longer than the lag, is no gap)."""
        mark = self._marks.get(partition)
        if mark is None:
            return True
        if partition in self._halted:
            return False
        first = partition not in self._caught_up
        self._caught_up.add(partition)
        if first and offset - 1 > mark.offset + 1:
            oldest_safe = self._oldest_safe()
            if mark.timestamp_ms is None or mark.timestamp_ms <= oldest_safe:
                stamp = self._stamp(partition, mark)
                if (stamp is None or stamp <= oldest_safe) and \
                        not self._gap(partition, mark.offset + 1, offset, stamp):
                    return False
        if offset - 1 > mark.offset:
            self._marks[partition] = _Mark(offset - 1, mark.timestamp_ms)
        return True

    # -- internals -----------------------------------------------------------------------

    def _oldest_safe(self) -> int:
        """Records younger than this (the brokers' time less the lag, plus a margin for the
        clocks) cannot have been removed."""
        lag = self.lag_ms or 0
        return self._now_ms() - lag + min(lag // 2, MAX_MARGIN_MS)

    def _now_ms(self) -> int:
        """The brokers' time, as well as this host can tell: its own clock, or the newest
        record time it has read when its clock runs behind theirs."""
        return max(self._clock_ms(), self._newest)

    def _stamp(self, partition: int, mark: _Mark) -> int | None:
        """The time of ``mark``; when not known yet, that of the last readable record at or
        before it (no later record is older); None when there is none."""
        if mark.timestamp_ms is not None or mark.offset < 0:
            return mark.timestamp_ms
        end, window = mark.offset + 1, 16
        while True:
            start = max(0, end - window)
            found = self.log.read_before(EVENTS, partition, start, window, end)
            if found:
                return found[-1].timestamp_ms
            if start == 0:
                return None
            window *= 8

    def _gap(self, partition: int, start: int, end: int, stamp: int | None) -> bool:
        """Offsets ``start`` to ``end - 1`` hold no readable record and the last record
        before them dates from ``stamp``: True to apply past them (accepted), else halt."""
        age = "of unknown age" if stamp is None else \
            f"{(self._now_ms() - stamp) / 1000:.0f}s old"
        why = (f"events partition {partition}: offsets {start} to {end - 1} hold no record "
               f"it can read, after a record {age}, older than min.compaction.lag.ms "
               f"({(self.lag_ms or 0) / 1000:g}s) allows: compaction may have removed accepted events "
               f"there, so no state past offset {start} is exact")
        if self.accept:
            logger.error("%s; applying past it (--accept-compaction-gaps)", why)
            return True
        why += "; halted there (`--accept-compaction-gaps` applies past it)"
        if self.on_halt is None:
            raise CompactionGap(why)
        self._halted[partition] = why
        logger.error("%s", why)
        self.on_halt(partition, why)
        return False
