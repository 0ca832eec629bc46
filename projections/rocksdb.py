"""RocksDB (rocksdict) backend of the projection: opening partitions and the reader.

Each partition of the events topic has its own RocksDB under the current generation
(see :mod:`projections.layout`) with five column families; the reader merges them.
Readers open read-only (a static view, reopened by :meth:`refresh`) or as a secondary
instance (caught up with the primary by :meth:`refresh`), both safe next to a running
projector.
"""

from __future__ import annotations

import heapq
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

from rocksdict import AccessType, BlockBasedOptions, Options, Rdict, ReadOptions

from effectlog.errors import BackendUnavailable
from projections import layout
from projections.snapshot import (
    decode_rejection,
    decode_snapshot,
    index_range,
    offset_key,
    rejected_key,
    snapshot_json,
    unpack_i64,
    unpack_u64,
)
from projections.store import ProjectionReader, Rejection

if TYPE_CHECKING:
    import logging

    from effectlog.log.base import Position
    from effectlog.model import EffectEvent, State



def _logger() -> logging.Logger:
    """This module's logger, imported on first use: read commands that never log skip the
    cost of importing :mod:`logging`."""
    import logging

    return logging.getLogger(__name__)

STATE, INDEX, OFFSETS, REJECTED, METADATA = "state", "index", "offsets", "rejected", "metadata"
COLUMN_FAMILIES = (STATE, INDEX, OFFSETS, REJECTED, METADATA)
COUNT_PREFIX = b"count:"
CLOCK_PREFIX = b"clock:"  # timing-dependent metadata, left out of digests
Mode = Literal["write", "read_only", "secondary"]
_OPEN_RETRIES = 5


class ProjectionLocked(BackendUnavailable):
    """Another process holds the partition's writer lock (a running projector)."""


def _cf_options(bloom: bool) -> Options:
    opts = Options(raw_mode=True)
    if bloom:
        table = BlockBasedOptions()
        table.set_bloom_filter(10, False)
        opts.set_block_based_table_factory(table)
    return opts


def _db_options(mode: Mode) -> Options:
    opts = Options(raw_mode=True)
    if mode == "write":
        opts.create_if_missing(True)
        opts.create_missing_column_families(True)
        # Small memtables keep the WAL short, so read-only opens (which replay it) stay fast.
        opts.set_write_buffer_size(8 << 20)
        opts.set_max_total_wal_size(32 << 20)
        opts.set_keep_log_file_num(3)
    else:
        opts.set_max_open_files(-1)
        # One thread opens the table files: starting RocksDB's default 16 threads costs a
        # one-shot reader (`effectlog get`) more than opening a partition's files takes.
        opts.set_max_file_opening_threads(1)
    return opts


def open_partition(path: Path, mode: Mode, secondary_path: str | None = None,
                   families: tuple[str, ...] = COLUMN_FAMILIES) -> Rdict:
    """Open one partition's RocksDB with ``families`` (a reader may open fewer; a writer
    opens all, creating what is missing).

    rocksdict raises bare ``Exception`` for every RocksDB status; opens are retried a few
    times (a read-only open can race the primary's file rotation) and then reported as
    :class:`BackendUnavailable`.
    """
    options = {name: _cf_options(name == STATE)
               for name in (COLUMN_FAMILIES if mode == "write" else families)}
    if mode == "write":
        access = AccessType.read_write()
    elif mode == "read_only":
        access = AccessType.read_only(False)
    else:
        access = AccessType.secondary(secondary_path or "")
    last = ""
    for attempt in range(_OPEN_RETRIES):
        try:
            return Rdict(str(path), _db_options(mode), column_families=options, access_type=access)
        except Exception as exc:  # rocksdict's only error type
            last = str(exc)
            if "lock" in last.lower():
                raise ProjectionLocked(f"projection {path} is locked by another projector: "
                                       f"{last}") from None
            time.sleep(0.02 * (attempt + 1))
    raise BackendUnavailable(f"cannot open projection {path}: {last}")


class _Partition:
    """One opened partition: the database and its column families."""

    def __init__(self, partition: int, path: Path, mode: Mode, families: tuple[str, ...]) -> None:
        self.partition = partition
        self.secondary_dir: str | None = None
        if mode == "secondary":
            import tempfile

            self.secondary_dir = tempfile.mkdtemp(prefix="effectlog-secondary-")
        self.db = open_partition(path, mode, self.secondary_dir, families)
        self.cf = {name: self.db.get_column_family(name) for name in families}

    def catch_up(self) -> None:
        try:
            self.db.try_catch_up_with_primary()
        except Exception as exc:  # rocksdict's only error type
            _logger().debug("secondary catch-up of partition %d failed: %s", self.partition, exc)

    def close(self) -> None:
        self.cf.clear()
        self.db.close()
        if self.secondary_dir:
            import shutil

            shutil.rmtree(self.secondary_dir, ignore_errors=True)


class RocksProjectionReader(ProjectionReader):
    """Reads the projection under ``state_dir`` across all partitions.

    ``families`` limits the column families opened (``get`` needs only ``state``; a
    query on one not opened raises KeyError). ``index_steps`` counts index entries visited
    by scans (a test hook showing that ``scan_state`` is a range scan, not a full scan).
    """

    def __init__(self, state_dir: str | os.PathLike[str], mode: Mode = "read_only",
                 families: tuple[str, ...] = COLUMN_FAMILIES) -> None:
        if mode == "write":
            raise ValueError("the reader never opens the projection for writing")
        self.state_dir = Path(state_dir)
        self.mode: Mode = mode
        self.families = families
        self.index_steps = 0
        self._generation: Path | None = None
        self._parts: dict[int, _Partition] = {}
        self._open()

    @property
    def exists(self) -> bool:
        """Whether a projection has been written under ``state_dir``."""
        return bool(self._parts)

    @property
    def partitions(self) -> list[int]:
        return sorted(self._parts)

    # -- lifecycle -----------------------------------------------------------------------

    def _open(self) -> None:
        self._generation = layout.current_generation(self.state_dir)
        for partition in layout.partitions_in(self._generation):
            assert self._generation is not None
            path = layout.partition_dir(self._generation, partition)
            self._parts[partition] = _Partition(partition, path, self.mode, self.families)

    def refresh(self) -> None:
        generation = layout.current_generation(self.state_dir)
        if self.mode == "secondary" and generation == self._generation \
                and set(layout.partitions_in(generation)) == set(self._parts):
            for part in self._parts.values():
                part.catch_up()
            return
        self.close()
        self._open()

    def close(self) -> None:
        for part in self._parts.values():
            part.close()
        self._parts.clear()

    # -- queries -------------------------------------------------------------------------

    def get_raw(self, key: str) -> bytes | None:
        """The stored snapshot bytes of ``key`` (see :mod:`projections.snapshot`)."""
        encoded = key.encode("utf-8")
        for part in self._parts.values():
            raw = part.cf[STATE].get(encoded)
            if raw is not None:
                return bytes(raw)
        return None

    def get(self, key: str) -> EffectEvent | None:
        raw = self.get_raw(key)
        return None if raw is None else decode_snapshot(raw)

    def get_json(self, key: str) -> dict[str, Any] | None:
        raw = self.get_raw(key)
        return None if raw is None else snapshot_json(raw)

    def scan_raw(self, state: str, older_than_ms: int | None = None,
                 limit: int | None = None) -> Iterator[tuple[int, str, bytes]]:
        """(last-transition ms, key, snapshot bytes) in ``state``, oldest first."""
        lower, upper = index_range(state, older_than_ms)
        streams = [self._index_range(part, lower, upper) for part in self._parts.values()]
        for count, (at_ms, key, raw) in enumerate(heapq.merge(*streams)):
            if limit is not None and count >= limit:
                return
            yield at_ms, key, raw

    def _index_range(self, part: _Partition, lower: bytes,
                     upper: bytes) -> Iterator[tuple[int, str, bytes]]:
        opts = ReadOptions()
        opts.set_iterate_upper_bound(upper)
        it = part.cf[INDEX].iter(opts)
        it.seek(lower)  # rocksdict ignores iterate_lower_bound on seek_to_first: seek instead
        state_cf = part.cf[STATE]
        skip = len(lower)
        while it.valid():
            self.index_steps += 1
            entry: bytes = it.key()
            key = entry[skip + 8:].decode("utf-8")
            raw = state_cf.get(entry[skip + 8:])
            if raw is not None:
                yield unpack_u64(entry[skip:skip + 8]), key, bytes(raw)
            it.next()

    def scan_state(self, state: State, older_than_ms: int | None = None,
                   limit: int | None = None) -> Iterator[EffectEvent]:
        for _, _, raw in self.scan_raw(state.value, older_than_ms, limit):
            yield decode_snapshot(raw)

    def scan_state_json(self, state: str, older_than_ms: int | None = None,
                        limit: int | None = None) -> Iterator[dict[str, Any]]:
        for _, _, raw in self.scan_raw(state, older_than_ms, limit):
            yield snapshot_json(raw)

    def rejected(self, limit: int | None = None) -> Iterator[Rejection]:
        count = 0
        for partition in sorted(self._parts):
            for _, value in self._parts[partition].cf[REJECTED].items():
                if limit is not None and count >= limit:
                    return
                count += 1
                yield _rejection(bytes(value))

    def rejected_at(self, position: Position) -> Rejection | None:
        part = self._parts.get(position.partition)
        if part is None:
            return None
        value = part.cf[REJECTED].get(rejected_key(position.offset))
        return None if value is None else _rejection(bytes(value))

    def next_offsets(self) -> dict[int, int]:
        out = {}
        for partition, part in sorted(self._parts.items()):
            raw = part.cf[OFFSETS].get(offset_key(partition))
            out[partition] = 0 if raw is None else unpack_u64(raw)
        return out

    def log_ids(self) -> dict[int, str | None]:
        """Per partition: the identity of the log it was projected from (None: unrecorded)."""
        from projections.lineage import stored_log_id

        return {p: stored_log_id(part.cf[METADATA]) for p, part in sorted(self._parts.items())}

    def counts(self) -> dict[str, int]:
        totals: dict[str, int] = {}
        for part in self._parts.values():
            for label, n in read_counts(part.cf[METADATA]).items():
                totals[label] = totals.get(label, 0) + n
        return {label: n for label, n in sorted(totals.items()) if n}


def read_counts(metadata: Rdict) -> dict[str, int]:
    """The ``count:`` entries of a partition's metadata column family."""
    counts: dict[str, int] = {}
    for name, value in metadata.items(from_key=COUNT_PREFIX):
        label = cast(bytes, name)
        if not label.startswith(COUNT_PREFIX):
            break
        counts[label[len(COUNT_PREFIX):].decode("utf-8")] = unpack_i64(value)
    return counts


def _rejection(value: bytes) -> Rejection:
    from effectlog.log.base import EVENTS, Position

    head, raw = decode_rejection(value)
    return Rejection(Position(EVENTS, head["partition"], head["offset"]), head["key"],
                     head["reason"], head["detail"], raw, head["at_ms"])
