"""Histories whose latest record the projector rejects, for every rejection reason, and the
digests that compare a restored projection with a full replay."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from effectlog.codec import event_codec
from effectlog.log import EVENTS, EventLog, open_log
from effectlog.log.base import TOMBSTONE
from effectlog.machine import advance, new_effect
from effectlog.model import EffectEvent, Outcome, State
from effectlog.model import Transition as T
from projections.projector import Projector, ProjectorSettings
from projections.rocksdb.digest import partition_digest

#: What a digest covers: current states with the positions of their accepted events, the
#: state/time index, counters and the log's identity (not the rejections, which a restore
#: from the changelog does not carry for records before its checkpoint).
RESTORED = ("state", "index", "metadata")
REASONS = ("stale_epoch", "foreign_owner", "unclaimed_epoch", "illegal_transition",
           "payload_mismatch", "duplicate", "undecodable")
#: Histories with expiries (b"": a tombstone): of a settled key, of a key then used again
#: (a new effect), and of an open key (rejected: not_settled).
EXPIRIES = ("expired", "expired_reused", "not_settled")


def history(reason: str, n: int, tag: str = "") -> list[EffectEvent | bytes]:
    """Events of one key whose last record is rejected for ``reason`` (bytes: written raw)."""
    created = new_effect(f"{tag}{reason}-{n}", "payment.charge", f"acct:{n}", {"n": n}, "w1")
    reserved = advance(created, T.RESERVE, "w1")
    if reason in EXPIRIES:
        return _expiring(reason, created, reserved, n, tag)
    if reason == "stale_epoch":  # a replacement claimed epoch 2; the first owner dispatches at 1
        claimed = advance(reserved, T.CLAIM, "w2")
        late = reserved.next(T.DISPATCH, State.DISPATCHED, attempt=reserved.attempt + 1)
        return [created, reserved, claimed, late]
    if reason == "foreign_owner":  # another worker writes with the owner's epoch
        return [created, reserved, reserved.next(T.DISPATCH, State.DISPATCHED, worker_id="w9",
                                                 attempt=reserved.attempt + 1)]
    if reason == "unclaimed_epoch":
        return [created, reserved, reserved.next(T.DISPATCH, State.DISPATCHED, fencing_epoch=2,
                                                 attempt=reserved.attempt + 1)]
    dispatched = advance(reserved, T.DISPATCH, "w1")
    if reason == "illegal_transition":  # a stale worker dispatches again after the outcome
        done = advance(dispatched, T.RECORD, "w1", outcome=Outcome(State.SUCCEEDED, {"ok": n}))
        return [created, reserved, dispatched, done,
                done.next(T.DISPATCH, State.DISPATCHED, attempt=done.attempt + 1)]
    if reason == "payload_mismatch":
        return [created, reserved, dispatched,
                replace(advance(dispatched, T.UNKNOWN, "w1", error="timeout"),
                        payload_hash="0" * 64)]
    if reason == "duplicate":
        return [created, reserved, dispatched, dispatched]
    assert reason == "undecodable"
    return [created, reserved, dispatched, b"\xc3\x01not avro at all"]


def _expiring(reason: str, created: EffectEvent, reserved: EffectEvent, n: int,
              tag: str) -> list[EffectEvent | bytes]:
    dispatched = advance(reserved, T.DISPATCH, "w1")
    if reason == "not_settled":
        return [created, reserved, TOMBSTONE, dispatched]
    done = advance(dispatched, T.RECORD, "w1", outcome=Outcome(State.SUCCEEDED, {"ok": n}))
    if reason == "expired":
        return [created, reserved, dispatched, done, TOMBSTONE]
    again = new_effect(f"{tag}{reason}-{n}", "payment.charge", f"acct:{n}", {"n": n + 100}, "w2")
    return [created, reserved, dispatched, done, TOMBSTONE, again, advance(again, T.RESERVE, "w2")]


def write_histories(log: EventLog, per_reason: int, tag: str = "") -> list[str]:
    """``per_reason`` keys per rejection reason, their records appended in order; the keys."""
    codec = event_codec()
    keys = []
    for reason in (*REASONS, *EXPIRIES):
        for n in range(per_reason):
            events = history(reason, n, tag)
            first = events[0]
            assert isinstance(first, EffectEvent)
            key = first.idempotency_key
            for event in events:
                value = event if isinstance(event, bytes) else codec.encode(event.to_record())
                log.append(EVENTS, key, value)
            keys.append(key)
    return keys


def replayed(url: str, state_dir: Path, accept_gaps: bool = False) -> dict[int, str]:
    """A full replay of the events topic (no changelog), digest per partition
    (``accept_gaps``: applying past gaps compaction may have made)."""
    settings = ProjectorSettings(accept_compaction_gaps=accept_gaps)
    with open_log(url) as log, Projector(log, state_dir, settings,
                                         from_changelog=False) as projector:
        projector.run(once=True)
        partitions = range(log.partitions(EVENTS))
    return {p: partition_digest(state_dir, p, RESTORED) for p in partitions}


def digests(state_dir: Path, partitions: list[int]) -> dict[int, str]:
    return {p: partition_digest(state_dir, p, RESTORED) for p in partitions}


@contextmanager
def opened(url: str) -> Iterator[EventLog]:
    log = open_log(url)
    try:
        yield log
    finally:
        log.close()
