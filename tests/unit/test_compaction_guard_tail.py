"""The compaction guard at the end of what a source can read.

Kafka's cleaner removes a key's records behind its tombstone, and the tombstone itself after
``delete.retention.ms``: a key's whole history can vanish from the end of a partition, with
no later record to show the gap. A stray expiry tombstone after a key that was used again (two
expirers, or one across a rebalance) is rejected by the projector, yet the cleaner obeys it.
A restore from a checkpoint before that stretch used to move past it: the key read as absent,
and a retried DISPATCH of it was accepted, a second provider call.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from effectlog.codec import event_codec
from effectlog.log.base import EVENTS, TOMBSTONE, Record
from effectlog.log.memory import MemoryLog
from effectlog.machine import advance, new_effect
from effectlog.model import Transition
from projections.projector import Projector
from tests.unit.test_changelog_restore import CompactedLog, MemoryChangelog, _apply_upto
from tests.unit.test_compaction_guard import (
    LAG_MS,
    OLD,
    YOUNG,
    LaggingLog,
    guard,
    record,
)


def test_several_empty_offsets_at_the_end_after_an_old_record_halt() -> None:
    made, halts = guard()
    assert made.admit(0, [record(0, OLD), record(1, OLD)]) == [record(0, OLD), record(1, OLD)]
    assert not made.reached(0, 5)  # offsets 2 to 4: a key's history and its tombstone, gone
    assert len(halts) == 1 and "offsets 2 to 4" in halts[0]
    assert made.admit(0, [record(5, YOUNG)]) == []


def test_several_empty_offsets_at_the_end_after_a_young_record_pass() -> None:
    made, halts = guard()
    assert made.admit(0, [record(0, YOUNG)]) == [record(0, YOUNG)]
    assert made.reached(0, 4)  # an aborted transaction: too young for the cleaner
    assert made.admit(0, [record(4, YOUNG)]) == [record(4, YOUNG)] and halts == []


def test_an_end_reached_when_young_is_not_judged_again_once_old() -> None:
    made, halts = guard([record(0, OLD)])
    made.start(0, 1)  # resumes past an old record: its time read from the log
    assert not made.reached(0, 4) and len(halts) == 1
    fresh, none = guard()
    assert fresh.admit(0, [record(0, YOUNG)]) and fresh.reached(0, 4)
    assert fresh.reached(0, 4) and none == []  # the mark moved: nothing left to judge


def test_a_live_projector_meeting_an_aborted_transaction_after_a_long_idle_spell_goes_on(
        ) -> None:
    """What appears past an end the projector reached since it started, it reads as it comes
    (the last record is older than the lag: the check by age alone would halt). A member
    frozen for longer than the lag loses its partitions and starts them again."""
    made, halts = guard()
    assert made.admit(0, [record(0, OLD)]) == [record(0, OLD)]
    assert made.reached(0, 1)  # caught up, then idle
    assert made.reached(0, 5)  # a writer killed mid-transaction: aborted records and marker
    assert made.admit(0, [record(5, YOUNG)]) == [record(5, YOUNG)] and halts == []
    made.start(0, 6)  # started again: its first end is judged by age
    assert not made.reached(0, 9) and len(halts) == 1


def _write(log: MemoryLog, key: str, event: Any) -> None:
    log.append(EVENTS, key, event if isinstance(event, bytes) else
               event_codec().encode(event.to_record()))


def test_a_restore_halts_before_a_tail_compaction_emptied_and_never_accepts_it_again(
        tmp_path: Path) -> None:
    log = MemoryLog()
    a = new_effect("op-a", "email.send", "to:a", {"n": 1}, "w1")
    _write(log, a.idempotency_key, a)
    _write(log, a.idempotency_key, advance(a, Transition.RESERVE, "w1"))
    k = new_effect("op-k", "payment.charge", "acct:k", {"n": 2}, "w1")
    key, reserved = k.idempotency_key, advance(k, Transition.RESERVE, "w1")
    # K dispatched (the provider called), then a stray tombstone (rejected: K is open)
    for event in (k, reserved, advance(reserved, Transition.DISPATCH, "w1"), TOMBSTONE):
        _write(log, key, event)
    old = int(time.time() * 1000) - 10 * LAG_MS
    written = [replace(r, timestamp_ms=old) for r in log.read(EVENTS, 0, 0, 1000)]
    changelog = MemoryChangelog()  # the owner published at offset 2, then died
    with Projector(CompactedLog(written, changelog, "log-1"), tmp_path / "owner") as owner:
        _apply_upto(owner, 2)
        changes = owner.store.writers()[0].take_changes()  # type: ignore[attr-defined]
        changelog.writer(0).publish(changes.changes, changes.checkpoint("log-1"))
    # the cleaner, much later: K's records go behind the tombstone, then the tombstone
    latest = {r.key: r.offset for r in written}
    kept = [r for r in written if latest[r.key] == r.offset and r.value]
    # K retried by another worker: young records after the emptied tail
    again = new_effect("op-k", "payment.charge", "acct:k", {"n": 2}, "w2")
    again_reserved = advance(again, Transition.RESERVE, "w2")
    retry = [Record(EVENTS, 0, len(written) + i, key, event_codec().encode(e.to_record()),
                    int(time.time() * 1000))
             for i, e in enumerate((again, again_reserved,
                                    advance(again_reserved, Transition.DISPATCH, "w2")))]
    halted: dict[int, str] = {}
    thinned = LaggingLog(kept, changelog, "log-1", len(written))
    with Projector(thinned, tmp_path / "restored", on_halt=halted.__setitem__) as restored:
        restored.run(once=True)
        thinned.kept, thinned._end = kept + retry, len(written) + len(retry)
        restored.run(once=True)
        assert restored.store.reader().get(key) is None  # type: ignore[attr-defined]
        assert restored.store.writers()[0].next_offset == 2  # type: ignore[attr-defined]
    assert list(halted) == [0] and "offsets 2 to 5" in halted[0]
