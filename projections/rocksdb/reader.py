"""Readers of the RocksDB projection: queries over a set of opened partitions.

:class:`PartitionReads` answers every query of the reader port from the partitions it is
given; a key's lookup opens only the key's own partition, computed from the key (the
log's ``partition_for``, by default Kafka's murmur2 over the recorded partition count).
:class:`RocksProjectionReader` opens the partitions found under a state directory
read-only (a static view, reopened by :meth:`refresh`) or as a secondary instance (caught
up with the primary by :meth:`refresh`), both safe next to a running projector.
"""

from __future__ import annotations

import heapq
import os
from abc import abstractmethod
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from rocksdict import ReadOptions

from effectlog.errors import BackendUnavailable
from projections.rocksdb import layout
from projections.rocksdb.db import (
    COLUMN_FAMILIES,
    INDEX,
    METADATA,
    OFFSETS,
    REJECTED,
    STATE,
    Mode,
    PartitionDB,
    read_counts,
)
from projections.rocksdb.snapshot import (
    APPLIED_KEY,
    decode_rejection,
    decode_snapshot,
    index_entry,
    index_range,
    offset_key,
    pack_u64,
    rejected_key,
    snapshot_json,
    unpack_u64,
)
from projections.store import Cursor, Logged, ProjectionReader, Rejection

if TYPE_CHECKING:
    from effectlog.log.base import Position
    from effectlog.model import EffectEvent, State

#: Maps a key to its partition of the events topic.
Partitioner = Callable[[str], int]


class ConsistentRead(NamedTuple):
    """One key as one RocksDB snapshot of its partition has it: every record of the
    partition below ``applied`` is reflected in ``raw`` (the stored snapshot, None for a key
    with no accepted event), read from projection ``generation``."""

    partition: int
    applied: int
    raw: bytes | None
    generation: str


class PartitionMoved(BackendUnavailable):
    """The partition was released (revoked, or a new projection swapped in) under a read."""


def default_partitioner(count: int) -> Partitioner:
    """Kafka's default (murmur2) placement over ``count`` partitions; one partition: 0."""
    if count <= 1:
        return lambda key: 0
    from effectlog.log.kafka.partitioner import murmur2_partition

    return lambda key: murmur2_partition(key.encode("utf-8"), count)


class PartitionReads(ProjectionReader):
    """The reader port over opened partitions (see :meth:`_opened` and :meth:`_one`).

    ``index_steps`` counts index entries visited by scans (a test hook showing that
    ``scan_state`` is a range scan, not a full scan).
    """

    index_steps = 0

    @abstractmethod
    def _opened(self) -> Mapping[int, PartitionDB]:
        """Every readable partition, opened."""

    @abstractmethod
    def _one(self, partition: int) -> PartitionDB | None:
        """``partition`` opened, or None when it is not here."""

    @abstractmethod
    def partition_of(self, key: str) -> int:
        """The partition ``key`` lives in."""

    def _generation_of(self, partition: int) -> str:
        """The name of the projection generation ``partition`` is read from."""
        return ""

    def read_consistent(self, key: str) -> ConsistentRead | None:
        """The key's stored snapshot and its partition's applied offset from ONE snapshot of
        the state family (both live there), so the two never come from different batches,
        generations or owners; None when the partition is not open here. Raises
        :class:`PartitionMoved` when the partition is released during the read."""
        partition = self.partition_of(key)
        part = self._one(partition)
        if part is None:
            return None
        try:
            snapshot = part.cf[STATE].snapshot()
            applied = _snapshot_get(snapshot, APPLIED_KEY)
            if applied is None:  # a projection from before the offset moved into the family
                applied = part.cf[OFFSETS].get(offset_key(partition))
            raw = _snapshot_get(snapshot, key.encode("utf-8"))
        except Exception as exc:  # rocksdict's only error type (or a cleared handle's KeyError)
            raise PartitionMoved(f"partition {partition} was released during a read: "
                                 f"{exc}") from None
        return ConsistentRead(partition, 0 if applied is None else unpack_u64(applied),
                              raw, self._generation_of(partition))

    # -- queries -------------------------------------------------------------------------

    def get_raw(self, key: str) -> bytes | None:
        """The stored snapshot bytes of ``key`` (see :mod:`projections.rocksdb.snapshot`)."""
        part = self._one(self.partition_of(key))
        if part is None:
            return None
        raw = part.cf[STATE].get(key.encode("utf-8"))
        return None if raw is None else bytes(raw)

    def get(self, key: str) -> EffectEvent | None:
        raw = self.get_raw(key)
        return None if raw is None else decode_snapshot(raw)

    def get_json(self, key: str) -> dict[str, Any] | None:
        raw = self.get_raw(key)
        return None if raw is None else snapshot_json(raw)

    def scan_raw(self, state: str, older_than_ms: int | None = None,
                 limit: int | None = None,
                 after: Cursor | None = None) -> Iterator[tuple[int, str, bytes]]:
        """(last-transition ms, key, snapshot bytes) in ``state``, oldest first; with
        ``after``, only those past that index position (one seek per partition)."""
        lower, upper = index_range(state, older_than_ms)
        if after is not None:
            # the smallest entry above the cursor's own: its bytes followed by a NUL
            lower = lower + pack_u64(max(after[0], 0)) + after[1].encode("utf-8") + b"\x00"
        if lower >= upper:
            return
        streams = [self._index_range(part, lower, upper) for part in self._opened().values()]
        for count, (at_ms, key, raw) in enumerate(heapq.merge(*streams)):
            if limit is not None and count >= limit:
                return
            yield at_ms, key, raw

    def _index_range(self, part: PartitionDB, lower: bytes,
                     upper: bytes) -> Iterator[tuple[int, str, bytes]]:
        opts = ReadOptions()
        opts.set_iterate_upper_bound(upper)
        it = part.cf[INDEX].iter(opts)
        it.seek(lower)  # rocksdict ignores iterate_lower_bound on seek_to_first: seek instead
        state_cf = part.cf[STATE]
        skip = lower.index(b"\x00") + 1  # the state's prefix
        while it.valid():
            self.index_steps += 1
            entry: bytes = it.key()
            name = entry[skip + 8:]
            raw = state_cf.get(name)
            # The iterator reads the index as it was when the scan began, the state family as
            # it is now: a key that moved on meanwhile (a DISPATCH applied since) is yielded
            # only under its new entry, so its age and its snapshot always belong together.
            if raw is not None and index_entry(bytes(raw), name) == entry:
                yield unpack_u64(entry[skip:skip + 8]), name.decode("utf-8"), bytes(raw)
            it.next()

    def scan_logged(self, state: State, older_than_ms: int | None = None,
                    limit: int | None = None, after: Cursor | None = None) -> Iterator[Logged]:
        for at_ms, _, raw in self.scan_raw(state.value, older_than_ms, limit, after):
            yield Logged(at_ms, decode_snapshot(raw))

    def scan_state_json(self, state: str, older_than_ms: int | None = None,
                        limit: int | None = None,
                        after: Cursor | None = None) -> Iterator[dict[str, Any]]:
        for _, _, raw in self.scan_raw(state, older_than_ms, limit, after):
            yield snapshot_json(raw)

    def rejected(self, limit: int | None = None) -> Iterator[Rejection]:
        count = 0
        parts = self._opened()
        for partition in sorted(parts):
            for _, value in parts[partition].cf[REJECTED].items():
                if limit is not None and count >= limit:
                    return
                count += 1
                yield _rejection(bytes(value))

    def rejected_at(self, position: Position) -> Rejection | None:
        part = self._one(position.partition)
        if part is None:
            return None
        try:
            value = part.cf[REJECTED].get(rejected_key(position.offset))
        except Exception as exc:  # rocksdict's only error type (or a cleared handle's KeyError)
            raise PartitionMoved(f"partition {position.partition} was released during a read: "
                                 f"{exc}") from None
        return None if value is None else _rejection(bytes(value))

    def next_offsets(self) -> dict[int, int]:
        out = {}
        for partition, part in sorted(self._opened().items()):
            raw = part.cf[STATE].get(APPLIED_KEY) if STATE in part.cf else None
            if raw is None and OFFSETS in part.cf:
                raw = part.cf[OFFSETS].get(offset_key(partition))
            out[partition] = 0 if raw is None else unpack_u64(raw)
        return out

    def log_ids(self) -> dict[int, str | None]:
        """Per partition: the identity of the log it was projected from (None: unrecorded)."""
        from projections.lineage import stored_log_id

        return {p: stored_log_id(part.cf[METADATA]) for p, part in sorted(self._opened().items())}

    def counts(self) -> dict[str, int]:
        totals: dict[str, int] = {}
        for part in self._opened().values():
            for label, n in read_counts(part.cf[METADATA]).items():
                totals[label] = totals.get(label, 0) + n
        return {label: n for label, n in sorted(totals.items()) if n}


class RocksProjectionReader(PartitionReads):
    """Reads the projection under ``state_dir``; partitions are opened when first needed.

    ``families`` limits the column families opened (``get`` needs only ``state``; a
    query on one not opened raises KeyError). ``partition_for`` maps a key to its
    partition (default: :func:`default_partitioner` over the recorded partition count).
    """

    def __init__(self, state_dir: str | os.PathLike[str], mode: Mode = "read_only",
                 families: tuple[str, ...] = COLUMN_FAMILIES,
                 partition_for: Partitioner | None = None) -> None:
        if mode == "write":
            raise ValueError("the reader never opens the projection for writing")
        self.state_dir = Path(state_dir)
        self.mode: Mode = mode
        self.families = families
        self._partition_for = partition_for
        self._parts: dict[int, PartitionDB] = {}
        self._locate()

    def _locate(self) -> None:
        self._generation = layout.current_generation(self.state_dir)
        self._present = layout.partitions_in(self._generation)
        count = layout.partition_count(self._generation) or max(self._present, default=0) + 1
        self._partitioner = self._partition_for or default_partitioner(count)

    @property
    def exists(self) -> bool:
        """Whether a projection has been written under ``state_dir``."""
        return bool(self._present)

    @property
    def partitions(self) -> list[int]:
        """The partitions stored under ``state_dir``."""
        return list(self._present)

    def partition_of(self, key: str) -> int:
        return self._partitioner(key)

    def _generation_of(self, partition: int) -> str:
        return "" if self._generation is None else self._generation.name

    def _one(self, partition: int) -> PartitionDB | None:
        part = self._parts.get(partition)
        if part is None and partition in self._present:
            assert self._generation is not None
            part = PartitionDB(partition, layout.partition_dir(self._generation, partition),
                               self.mode, self.families)
            self._parts[partition] = part
        return part

    def _opened(self) -> Mapping[int, PartitionDB]:
        for partition in self._present:
            self._one(partition)
        return self._parts

    def refresh(self) -> None:
        generation = layout.current_generation(self.state_dir)
        if self.mode == "secondary" and generation == self._generation \
                and layout.partitions_in(generation) == self._present:
            for part in self._parts.values():
                part.catch_up()
            return
        self.close()
        self._locate()

    def close(self) -> None:
        for part in self._parts.values():
            part.close()
        self._parts.clear()


def _snapshot_get(snapshot: Any, name: bytes) -> bytes | None:
    """``snapshot[name]``, None when absent (rocksdict's snapshots raise for a missing key)."""
    try:
        return bytes(snapshot[name])
    except Exception as exc:  # rocksdict's only error type
        if "not found" in str(exc):
            return None
        raise


def _rejection(value: bytes) -> Rejection:
    from effectlog.log.base import EVENTS, Position

    head, raw = decode_rejection(value)
    return Rejection(Position(EVENTS, head["partition"], head["offset"]), head["key"],
                     head["reason"], head["detail"], raw, head["at_ms"])
