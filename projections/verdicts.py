"""The judge's answer about one key, made from one consistent read of its partition.

A verdict is positive only when the projection has the writer's own event among the key's
accepted events: the same event id at the same offset (or, in a snapshot of the first
format, which kept no positions, as the key's latest accepted event). Anything else is a
negative verdict with a reason: the rejection the projector stored at that offset, another
event accepted there, or an event the snapshot no longer remembers. "No rejection stored" is
never read as accepted.
"""

from __future__ import annotations

from collections.abc import Callable

from effectlog.judge.query import FORGOTTEN, OTHER_EVENT, Answer, Premises, Query, Verdict, Written
from projections.rocksdb.reader import ConsistentRead
from projections.rocksdb.snapshot import MAX_ACCEPTED, Stored, decode_stored, snapshot_json

#: The reason of a verdict on an event the judge neither accepted nor stored a rejection for.
NOT_ACCEPTED = "not_accepted"
#: Looks up the rejection reason stored for an offset of the partition (None: none stored).
RejectionAt = Callable[[int], str | None]


def verdict_on(written: Written, stored: Stored | None, rejection_at: RejectionAt) -> Verdict:
    """The verdict on one written event, given the key's stored snapshot."""
    if stored is not None:
        if (written.offset, written.event_id) in stored.accepted:
            return Verdict(written.offset, written.event_id, True)
        if not stored.accepted and stored.event.event_id == written.event_id:
            return Verdict(written.offset, written.event_id, True)  # format 1: latest only
        if any(offset == written.offset for offset, _ in stored.accepted):
            return Verdict(written.offset, written.event_id, False, OTHER_EVENT)
    reason = rejection_at(written.offset)
    if reason is None and stored is not None and len(stored.accepted) >= MAX_ACCEPTED \
            and written.offset < stored.accepted[0][0]:
        reason = FORGOTTEN
    return Verdict(written.offset, written.event_id, False, reason or NOT_ACCEPTED)


def answer_from(read: ConsistentRead, query: Query, premises: Premises,
                rejection_at: RejectionAt) -> Answer:
    """The answer to ``query`` from ``read`` (which must reach what the query waits for)."""
    stored = None if read.raw is None else decode_stored(read.raw)
    return Answer(
        key=query.key, partition=read.partition, applied=read.applied,
        state=None if stored is None else stored.event,
        verdicts=tuple(verdict_on(w, stored, rejection_at) for w in query.written),
        premises=premises,
        snapshot=None if read.raw is None else snapshot_json(read.raw))
