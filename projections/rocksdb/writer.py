"""Exactly-once apply of one partition's records to its RocksDB (the writer port).

A poll batch is judged with :func:`effectlog.machine.check` (the writer's own rules) and
committed as ONE WriteBatch holding the snapshots (each with the positions of its key's
accepted events), index moves, rejections, counters and the partition's applied offset.
Killed at any instant, the database holds either the whole batch or none of it, and the
projector resumes at the stored offset. The applied offset sits in the state column family,
next to the snapshots, so one snapshot of that family reads a key's state, its accepted
events and how far the partition is applied, as of one batch (see :meth:`read_judged`).

The WriteBatch is written with ``sync=False``: the WAL write reaches the OS before
``write`` returns, so a killed process loses nothing; a power loss may drop the WAL tail,
which rolls state and offset back together and is simply re-applied from the log.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from pathlib import Path

from rocksdict import WriteBatch, WriteOptions

from effectlog.codec import event_codec
from effectlog.errors import Conflict, EffectlogError, ExpiresAnother, NotSettled
from effectlog.log.base import EventLog, Record
from effectlog.log.changelog import Change
from effectlog.machine import check, check_binding, check_expiry
from effectlog.model import EffectEvent, State, Transition
from effectlog.stats import EXPIRED
from projections.checkpoint import Changes, Checkpoint
from projections.decoding import Decoded, decode_values
from projections.fastevent import Fields, event_from_fields
from projections.rocksdb import changes
from projections.rocksdb.changes import ChangeTracker
from projections.rocksdb.db import (
    CLOCK_PREFIX,
    COLUMN_FAMILIES,
    COUNT_PREFIX,
    INDEX,
    METADATA,
    OFFSETS,
    REJECTED,
    STATE,
    PartitionDB,
    read_counts,
)
from projections.rocksdb.snapshot import (
    APPLIED_KEY,
    Accepted,
    Stored,
    decode_stored,
    encode_rejection,
    index_prefix,
    offset_key,
    pack_i64,
    pack_u64,
    rejected_key,
    snapshot_from_fields,
    unpack_u64,
    with_accepted,
)
from projections.store import Applied, PartitionWriter

logger = logging.getLogger(__name__)

UNDECODABLE = "undecodable"
KEY_MISMATCH = "key_mismatch"
DUPLICATE = "duplicate"
INVALID = "invalid_event"
#: Records read whose header carries the writer fingerprint byte-reversed (pre-spec order).
LEGACY_ORDER = "legacy:fingerprint_order"
_INDEX_PREFIX = {state: index_prefix(state.value) for state in State}
_STATE_LABEL = {state: f"state:{state.value}" for state in State}


def event_metrics(event: EffectEvent) -> tuple[str, ...]:
    """Counters an accepted event adds to (``metric:`` labels in the metadata family):
    provider attempts, confirmed effects, reconciliations and decisions, kept apart."""
    if event.transition is Transition.DISPATCH:
        return ("metric:attempts",)
    if event.transition is Transition.RECORD and event.outcome is not None:
        labels = [f"metric:recorded:{event.state.value.lower()}"]
        if event.state is State.SUCCEEDED:
            labels.append("metric:confirmed_effects")
        if event.outcome.source == "lookup":
            labels.append("metric:reconciled")
        return tuple(labels)
    if event.transition is Transition.APPROVE and event.approval is not None:
        return (f"metric:decisions:{event.approval.decision.value.lower()}",)
    return ()


def rejection_reason(exc: EffectlogError) -> str:
    """The stored reason of a refused event: the Conflict subclass's ``reason``; the bare
    :class:`Conflict` that ``check`` raises for a repeated event id is a duplicate delivery."""
    if type(exc) is Conflict:
        return DUPLICATE
    if isinstance(exc, Conflict):
        return exc.reason
    return INVALID


class RocksPartitionWriter(PartitionWriter):
    """The only writer of one partition's RocksDB; keeps an LRU of hot snapshots.

    ``handle`` (the open database) may be read from other threads while batches are
    applied: RocksDB makes each WriteBatch visible at once and as a whole.
    """

    def __init__(self, path: Path, partition: int, cache_size: int = 50_000) -> None:
        self.path = path
        self.partition = partition
        self.trust_first = False
        self.cache_size = cache_size
        self.handle = PartitionDB(partition, path, "write")
        self.db = self.handle.db
        self._cf = self.handle.cf
        self._h = {name: self.db.get_column_family_handle(name) for name in COLUMN_FAMILIES}
        self._write_opts = WriteOptions()
        self._write_opts.sync = False
        self._cache: OrderedDict[str, Stored] = OrderedDict()
        raw = self._cf[STATE].get(APPLIED_KEY)
        if raw is None:  # a projection from before the offset moved into the state family
            raw = self._cf[OFFSETS].get(offset_key(partition))
        self.next_offset = 0 if raw is None else unpack_u64(raw)
        self.counts = read_counts(self._cf[METADATA])
        self.tracker = ChangeTracker()  # keys changed since the last changelog publication

    def clear(self) -> None:
        """Empty the partition (every column family), to be restored."""
        batch = WriteBatch(raw_mode=True)
        for name in COLUMN_FAMILIES:
            batch.delete_range(b"", b"\xff", self._h[name])  # keys never start with 0xff
        with self.tracker.lock:
            self.db.write(batch, self._write_opts)
        self.adopt(0, {})
        self.tracker.published = -1

    def adopt(self, next_offset: int, counts: dict[str, int]) -> None:
        """The partition was restored under this writer (from a changelog): continue there."""
        with self.tracker.lock:
            self.next_offset = next_offset
            self.counts = {label: n for label, n in counts.items() if n}
            self._cache.clear()
            self.tracker.dirty.clear()
            self.tracker.published = next_offset

    def close(self) -> None:
        """Flush memtables (so readers replay no WAL) and release the lock."""
        try:
            self.db.flush()
        finally:
            # Column family handles keep the database open: while a reference to this
            # writer outlives it (an exception's traceback), the lock would stay held.
            self._h.clear()
            self.handle.close()

    def bind_log(self, log: EventLog) -> None:
        from projections import lineage

        lineage.bind(self._cf[METADATA], log, self.partition, self.next_offset,
                     f"the projection {self.path}")

    def take_changes(self) -> Changes | None:
        return changes.take_changes(self)

    def publish_all(self) -> None:
        with self.tracker.lock:
            self.tracker.full = True

    def published(self, taken: Changes, ok: bool) -> None:
        (changes.published if ok else changes.untake)(self, taken)

    def restore(self, records: Iterable[Change], log_id: str | None) -> Checkpoint | None:
        return changes.restore(self, records, log_id)

    def skip_to(self, next_offset: int) -> None:
        """Move the stored offset over offsets that hold no records (Kafka's transaction
        markers, compacted tails), so "applied up to the log end" can be true."""
        if next_offset <= self.next_offset:
            return
        batch = WriteBatch(raw_mode=True)
        batch.put(APPLIED_KEY, pack_u64(next_offset), self._h[STATE])
        with self.tracker.lock:
            self.db.write(batch, self._write_opts)
            self.next_offset = next_offset

    def apply(self, records: Sequence[Record], decoded: Sequence[Decoded] | None = None) -> Applied:
        """Judge and commit ``records`` (consecutive, from this partition) in one WriteBatch.

        ``decoded`` holds what a decoder made of them (see :mod:`projections.decoding`);
        records below the stored next offset were applied before and are skipped.
        """
        skip = 0
        while skip < len(records) and records[skip].offset < self.next_offset:
            skip += 1
        if skip == len(records):
            return Applied(0, 0, 0, self.next_offset)
        records = records[skip:]
        items = _events(decode_values([r.value for r in records]) if decoded is None
                        else decoded[skip:])
        originals = self._load({item[0].idempotency_key for item in items
                                if not isinstance(item, str)}
                               | {r.key for r in records if not r.value})
        current = {key: None if stored is None else stored.event
                   for key, stored in originals.items()}
        accepted: dict[str, Fields] = {}  # key -> fields of its latest accepted event
        positions: dict[str, Accepted] = {key: stored.accepted
                                          for key, stored in originals.items() if stored}
        logged: dict[str, int] = {}  # key -> log time of its latest accepted record
        removed: set[str] = set()  # keys an accepted expiry removed (not created again)
        counts: dict[str, int] = {}
        is_legacy = event_codec().is_legacy
        if n_legacy := sum(1 for r in records if is_legacy(r.value)):
            counts[LEGACY_ORDER] = n_legacy
        batch = WriteBatch(raw_mode=True)
        rejected = 0
        for record, item in zip(records, items, strict=True):
            if not record.value:  # a tombstone: the key's expiry
                key = record.key
                try:
                    check_expiry(current.get(key), key, record.expires)
                except (NotSettled, ExpiresAnother) as exc:
                    self._reject(batch, counts, record, key, exc.reason, str(exc))
                    rejected += 1
                    continue
                current[key] = None
                for changed in (accepted, positions, logged):
                    changed.pop(key, None)
                removed.add(key)
                counts[EXPIRED] = counts.get(EXPIRED, 0) + 1
                continue
            if isinstance(item, str):
                self._reject(batch, counts, record, record.key, UNDECODABLE, item)
                rejected += 1
                continue
            event, fields = item
            key = event.idempotency_key
            try:
                if record.key != key:
                    raise _KeyMismatch(f"log key {record.key!r} differs from the event's "
                                       f"idempotency key {key!r}")
                prior = current.get(key)
                if (prior is None and self.trust_first
                        and event.transition is not Transition.CREATE):
                    check_binding(None, event)
                else:
                    check(prior, event)
            except EffectlogError as exc:
                reason = KEY_MISMATCH if isinstance(exc, _KeyMismatch) else rejection_reason(exc)
                self._reject(batch, counts, record, key, reason, str(exc))
                rejected += 1
                continue
            current[key] = event
            removed.discard(key)
            accepted[key] = fields
            positions[key] = with_accepted(positions.get(key, ()), record.offset, event.event_id)
            logged[key] = record.timestamp_ms
            for label in event_metrics(event):
                counts[label] = counts.get(label, 0) + 1
        stored = {key: Stored(new, logged[key], positions[key])
                  for key in accepted if (new := current[key]) is not None}
        self._stage_states(batch, counts, originals, stored, accepted)
        self._stage_removals(batch, counts, originals, removed)
        next_offset = records[-1].offset + 1
        batch.put(APPLIED_KEY, pack_u64(next_offset), self._h[STATE])
        totals = self._stage_counts(batch, counts)
        with self.tracker.lock:  # what a changelog publication reads sees whole batches
            self.db.write(batch, self._write_opts)
            for label, total in totals.items():
                if total:
                    self.counts[label] = total
                else:
                    self.counts.pop(label, None)
            self.next_offset = next_offset
            self.tracker.changed(key.encode("utf-8") for key in stored)
            self.tracker.removed(key.encode("utf-8") for key in removed)
        self._remember(originals, stored, removed)
        return Applied(len(records), len(records) - rejected, rejected, next_offset)

    # -- steps ---------------------------------------------------------------------------

    def _load(self, keys: set[str]) -> dict[str, Stored | None]:
        """Current snapshots of ``keys``: from the LRU, the rest with one multi-get."""
        found: dict[str, Stored | None] = {}
        missing = []
        cache = self._cache
        for key in keys:
            hit = cache.get(key)
            if hit is None:
                missing.append(key)
            else:
                cache.move_to_end(key)
                found[key] = hit
        if missing:
            values = self._cf[STATE].get([k.encode("utf-8") for k in missing])
            assert isinstance(values, list)
            for key, raw in zip(missing, values, strict=True):
                found[key] = None if raw is None else decode_stored(raw)
        return found

    def _stage_states(self, batch: WriteBatch, counts: dict[str, int],
                      originals: dict[str, Stored | None], stored: dict[str, Stored],
                      accepted: dict[str, Fields]) -> None:
        """Snapshot puts, index moves and per-state counts of the keys the batch changed."""
        put, delete = batch.put, batch.delete
        h_state, h_index = self._h[STATE], self._h[INDEX]
        moves: dict[State, int] = {}
        for key, fields in accepted.items():
            new = stored[key]
            old = originals.get(key)
            name = key.encode("utf-8")
            put(name, snapshot_from_fields(fields, new.logged_at, new.accepted), h_state)
            if old is not None:
                delete(_INDEX_PREFIX[old.event.state] + pack_u64(max(old.logged_at, 0)) + name,
                       h_index)
                moves[old.event.state] = moves.get(old.event.state, 0) - 1
            put(_INDEX_PREFIX[new.event.state] + pack_u64(max(new.logged_at, 0)) + name, b"",
                h_index)
            moves[new.event.state] = moves.get(new.event.state, 0) + 1
        for state, delta in moves.items():
            label = _STATE_LABEL[state]
            counts[label] = counts.get(label, 0) + delta

    def _stage_removals(self, batch: WriteBatch, counts: dict[str, int],
                        originals: dict[str, Stored | None], removed: set[str]) -> None:
        """Snapshot and index deletes of the keys an expiry removed, and their counts."""
        h_state, h_index = self._h[STATE], self._h[INDEX]
        for key in removed:
            old = originals.get(key)
            if old is None:
                continue  # created and expired within this batch: nothing stored
            name = key.encode("utf-8")
            batch.delete(name, h_state)
            batch.delete(_INDEX_PREFIX[old.event.state] + pack_u64(max(old.logged_at, 0)) + name,
                         h_index)
            label = _STATE_LABEL[old.event.state]
            counts[label] = counts.get(label, 0) - 1

    def _stage_counts(self, batch: WriteBatch, counts: dict[str, int]) -> dict[str, int]:
        """Stage the changed counters (a zero count is no key) and the update time."""
        meta = self._h[METADATA]
        totals = {label: self.counts.get(label, 0) + delta
                  for label, delta in counts.items() if delta}
        for label, total in totals.items():
            name = COUNT_PREFIX + label.encode("utf-8")
            if total:
                batch.put(name, pack_i64(total), meta)
            else:
                batch.delete(name, meta)
        batch.put(CLOCK_PREFIX + b"updated_ms", pack_u64(int(time.time() * 1000)), meta)
        return totals

    def _reject(self, batch: WriteBatch, counts: dict[str, int], record: Record, key: str,
                reason: str, detail: str) -> None:
        logger.debug("rejected %s at %d/%d: %s", key, record.partition, record.offset, detail)
        batch.put(rejected_key(record.offset),
                  encode_rejection(record.partition, record.offset, key, reason, detail,
                                   record.value, record.timestamp_ms), self._h[REJECTED])
        label = f"rejected:{reason}"
        counts[label] = counts.get(label, 0) + 1

    def _remember(self, originals: dict[str, Stored | None], stored: dict[str, Stored],
                  removed: set[str]) -> None:
        """Keep the batch's keys in the LRU, the changed ones as most recent."""
        cache = self._cache
        for key in removed:
            cache.pop(key, None)
        for key, found in originals.items():
            if found is not None and key not in stored and key not in removed \
                    and key not in cache:
                cache[key] = found
        for key, new in stored.items():
            cache[key] = new
            cache.move_to_end(key)
        while len(cache) > self.cache_size:
            cache.popitem(last=False)


def _events(decoded: Sequence[Decoded]) -> list[tuple[EffectEvent, Fields] | str]:
    """(event, fields) per decoded record; a str says why it is undecodable."""
    items: list[tuple[EffectEvent, Fields] | str] = []
    append = items.append
    for entry in decoded:
        if isinstance(entry, str):
            append(entry)
            continue
        try:
            append((event_from_fields(entry), entry))
        except (KeyError, ValueError, TypeError) as exc:
            append(f"{type(exc).__name__}: {exc}")
    return items


class _KeyMismatch(EffectlogError):
    """The log record's key is not the event's idempotency key."""
