"""What a partition's owner publishes to the changelog, and how a partition is restored from it.

The writer notes every key a batch changed (:class:`ChangeTracker`), under the lock it holds
while it commits the batch. :func:`take_changes` swaps that set out and takes a RocksDB snapshot
of the state family under the same lock, so the states it then reads and the applied offset of
its checkpoint reflect exactly the same batches: published together, they are a prefix of a
full replay. :func:`restore` writes a changelog's records into an empty partition: each key's
stored state as it was published, its index entry, and the last checkpoint's offset and
counters.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from rocksdict import WriteBatch

from effectlog.errors import WrongLog
from effectlog.log.changelog import CHECKPOINT_KEY, Change
from projections.checkpoint import Changes, Checkpoint
from projections.rocksdb.db import COUNT_PREFIX, INDEX, METADATA, STATE
from projections.rocksdb.snapshot import APPLIED_KEY, index_entry, pack_i64, pack_u64

if TYPE_CHECKING:
    from projections.rocksdb.writer import RocksPartitionWriter

_CHUNK = 5000


#: Changed keys tracked one by one; past this many the next publication carries every key.
TRACKED = 200_000


@dataclass(slots=True)
class ChangeTracker:
    """The keys changed since the last publication, guarded by the writer's commit lock;
    ``full``: the next publication carries every key (nothing of this partition was published
    from this copy, or too many keys changed to track one by one)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    dirty: set[bytes] = field(default_factory=set)
    #: keys an expiry removed: kept apart from ``dirty`` and never dropped, since a
    #: publication of every key cannot name the keys that are gone
    gone: set[bytes] = field(default_factory=set)
    full: bool = False
    published: int = -1  # the applied offset of the last publication (-1: none yet)

    def changed(self, keys: Iterable[bytes]) -> None:
        """Note ``keys`` (under ``lock``)."""
        if self.full:
            return
        self.dirty.update(keys)
        if len(self.dirty) > TRACKED:
            self.dirty.clear()
            self.full = True

    def removed(self, keys: Iterable[bytes]) -> None:
        """Note keys an expiry removed (under ``lock``)."""
        self.gone.update(keys)


def take_changes(writer: RocksPartitionWriter) -> Changes | None:
    """The changes since the last publication (None: nothing to publish). Hand them back
    with :func:`untake` when their publication failed."""
    tracker = writer.tracker
    with tracker.lock:
        if not tracker.dirty and not tracker.gone and not tracker.full \
                and writer.next_offset <= tracker.published:
            return None
        snapshot = writer.handle.cf[STATE].snapshot()
        applied, counts = writer.next_offset, dict(writer.counts)
        dirty, tracker.dirty = tracker.dirty, set()
        gone, tracker.gone = tracker.gone, set()
        full, tracker.full = tracker.full, False
    if full:
        every: list[Change] = []
        for name, value in snapshot.items():
            key = cast(bytes, name)
            if not key.startswith(b"\x00"):
                every.append((key, cast(bytes, value)))
                gone.discard(key)  # expired, then used again
        every.extend((key, None) for key in sorted(gone))
        return Changes(writer.partition, applied, counts, every, full=True)
    changes: list[Change] = []
    for key in sorted(dirty | gone):
        try:
            changes.append((key, bytes(snapshot[key])))
        except Exception as exc:  # rocksdict's only error type: absent, the key was removed
            if "not found" not in str(exc):
                raise
            changes.append((key, None))
    return Changes(writer.partition, applied, counts, changes)


def untake(writer: RocksPartitionWriter, changes: Changes) -> None:
    """A publication failed: its keys are published with the next one."""
    with writer.tracker.lock:
        writer.tracker.removed(key for key, value in changes.changes if value is None)
        if changes.full:
            writer.tracker.full = True
        else:
            writer.tracker.changed(key for key, value in changes.changes if value is not None)


def published(writer: RocksPartitionWriter, changes: Changes) -> None:
    with writer.tracker.lock:
        writer.tracker.published = max(writer.tracker.published, changes.applied)


def restore(writer: RocksPartitionWriter, records: Iterable[Change],
            log_id: str | None) -> Checkpoint | None:
    """Write a changelog's records into ``writer``'s empty partition; the last checkpoint
    (None: the changelog held none, and nothing is restored). A checkpoint of another events
    log is refused (:class:`WrongLog`)."""
    h_state, h_index, h_meta = (writer.db.get_column_family_handle(n)
                                for n in (STATE, INDEX, METADATA))
    state_cf = writer.handle.cf[STATE]
    last: Checkpoint | None = None
    chunk: dict[bytes, bytes | None] = {}

    def flush() -> None:
        batch = WriteBatch(raw_mode=True)
        keys = list(chunk)
        before = state_cf.get(cast(list[Any], keys))
        assert isinstance(before, list)
        for key, old in zip(keys, before, strict=True):
            if old is not None:
                batch.delete(index_entry(bytes(old), key), h_index)
            value = chunk[key]
            if value is None:
                batch.delete(key, h_state)
            else:
                batch.put(key, value, h_state)
                batch.put(index_entry(value, key), b"", h_index)
        writer.db.write(batch)
        chunk.clear()

    for key, value in records:
        if key == CHECKPOINT_KEY:
            if value is not None:
                last = Checkpoint.decode(value)
            continue
        chunk[key] = value
        if len(chunk) >= _CHUNK:
            flush()
    if chunk:
        flush()
    if last is None:
        return None
    if log_id is not None and last.log_id is not None and last.log_id != log_id:
        raise WrongLog(f"the changelog of partition {writer.partition} was published from "
                       f"events log {last.log_id}, not {log_id}: {WrongLog.HINT}")
    batch = WriteBatch(raw_mode=True)
    for label, total in last.counts.items():
        batch.put(COUNT_PREFIX + label.encode("utf-8"), pack_i64(total), h_meta)
    batch.put(APPLIED_KEY, pack_u64(last.applied), h_state)
    writer.db.write(batch)
    writer.adopt(last.applied, last.counts)
    return last

