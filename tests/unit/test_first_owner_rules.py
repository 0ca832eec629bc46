"""The first owner of a new log judges a key's first record by the rules, as every owner
restored from the changelog does: a late DISPATCH of an expired key is rejected by both.

It used to take a key's first record read as the key's baseline (checked only for its
binding), for the whole life of a partition opened at offset 0 before any publication, so a
paused claimant's DISPATCH after the key expired got a positive verdict from that owner and
a negative one from the next. Only past a gap the operator accepted may a first record
follow removed ones (``--accept-compaction-gaps``)."""

from __future__ import annotations

from pathlib import Path

from effectlog.codec import event_codec
from effectlog.judge.query import Premises, Query, Written
from effectlog.log.base import EVENTS, TOMBSTONE, Record
from effectlog.log.memory import MemoryLog
from effectlog.machine import advance, new_effect
from effectlog.model import EffectEvent, Outcome, State
from effectlog.model import Transition as T
from projections.projector import Projector
from projections.verdicts import answer_from
from tests.unit.test_changelog_restore import CompactedLog, MemoryChangelog, _apply_upto


def expired_then_late() -> tuple[str, EffectEvent, list[Record]]:
    """w1 reserves; recovery claims, dispatches and records; the key expires; then w1's
    DISPATCH at its old epoch reaches the log (it was paused between its claim and it)."""
    created = new_effect("op-1", "payment.charge", "acct:1", {"n": 1}, "w1")
    reserved = advance(created, T.RESERVE, "w1")
    claimed = advance(reserved, T.CLAIM, "reconciler")
    dispatched = advance(claimed, T.DISPATCH, "reconciler")
    done = advance(dispatched, T.RECORD, "reconciler",
                   outcome=Outcome(State.SUCCEEDED, {"ok": 1}))
    late = reserved.next(T.DISPATCH, State.DISPATCHED, attempt=reserved.attempt + 1)
    codec, log = event_codec(), MemoryLog()
    for event in (created, reserved, claimed, dispatched, done, TOMBSTONE, late):
        value = event if isinstance(event, bytes) else codec.encode(event.to_record())
        log.append(EVENTS, created.idempotency_key, value)
    return created.idempotency_key, late, log.read(EVENTS, 0, 0, 100)


def accepted(projector: Projector, key: str, offset: int, event_id: str) -> bool:
    read = projector.store.reader().read_consistent(key)  # type: ignore[attr-defined]
    answer = answer_from(read, Query(key, written=(Written(offset, event_id),)),
                         Premises("log-1", "g", "j", "me"), lambda _: None)
    return answer.verdicts[0].accepted


def test_the_first_owner_and_a_restored_owner_both_reject_a_late_dispatch_after_an_expiry(
        tmp_path: Path) -> None:
    key, late, records = expired_then_late()
    at = records[-1].offset
    changelog = MemoryChangelog()
    with Projector(CompactedLog(records, changelog, "log-1"), tmp_path / "first") as first:
        _apply_upto(first, at)  # up to the expiry, then published
        store = first.store.writers()[0]  # type: ignore[attr-defined]
        changes = store.take_changes()
        changelog.writer(0).publish(changes.changes, changes.checkpoint("log-1"))
        store.published(changes, ok=True)
        _apply_upto(first, at + 1)
        first_says = accepted(first, key, at, late.event_id)
    with Projector(CompactedLog(records, changelog, "log-1"), tmp_path / "next") as restored:
        _apply_upto(restored, at + 1)
        next_says = accepted(restored, key, at, late.event_id)
    assert (first_says, next_says) == (False, False)
