"""One partition's RocksDB: its column families, how it is opened, its stored counters.

Each partition of the events topic has its own RocksDB (see :mod:`.layout`) with five column
families. A writer opens it read-write (creating what is missing); readers open it
read-only (a static view) or as a secondary instance (caught up with the primary on demand).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Literal, cast

from rocksdict import AccessType, BlockBasedOptions, Options, Rdict

from effectlog.errors import BackendUnavailable
from projections.rocksdb.snapshot import unpack_i64

if TYPE_CHECKING:
    import logging

STATE, INDEX, OFFSETS, REJECTED, METADATA = "state", "index", "offsets", "rejected", "metadata"
COLUMN_FAMILIES = (STATE, INDEX, OFFSETS, REJECTED, METADATA)
COUNT_PREFIX = b"count:"
CLOCK_PREFIX = b"clock:"  # timing-dependent metadata, left out of digests
Mode = Literal["write", "read_only", "secondary"]
_OPEN_RETRIES = 5


def _logger() -> logging.Logger:
    """This module's logger, imported on first use: read commands that never log skip the
    cost of importing :mod:`logging`."""
    import logging

    return logging.getLogger(__name__)


class ProjectionLocked(BackendUnavailable):
    """Another process holds the partition's writer lock (a running projector)."""


class ProjectionDamaged(BackendUnavailable):
    """A partition's RocksDB does not open for a reason other than access or space (a
    corrupted or missing file): ``effectlog rebuild`` builds the projection anew."""

    def __init__(self, path: Path, status: str) -> None:
        super().__init__(f"cannot open projection {path}: {status} (`effectlog rebuild` "
                         "builds the projection anew from the log)")
        self.path = path
        self.status = status


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
    :class:`BackendUnavailable`, suggesting ``effectlog rebuild`` where the database is
    damaged rather than out of reach.
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
            if mode == "read_only":
                return _open_read_only(path, options, access)
            return Rdict(str(path), _db_options(mode), column_families=options, access_type=access)
        except Exception as exc:  # rocksdict's only error type
            last = str(exc)
            if "lock" in last.lower():
                raise ProjectionLocked(f"projection {path} is locked by another projector: "
                                       f"{last}") from None
            time.sleep(0.02 * (attempt + 1))
    if any(cause in last for cause in _OUT_OF_REACH):
        raise BackendUnavailable(f"cannot open projection {path}: {last}")
    raise ProjectionDamaged(path, last)


#: RocksDB statuses that say the files are out of reach rather than damaged.
_OUT_OF_REACH = ("Permission denied", "No space left", "Read-only file system",
                 "Too many open files")


def _open_read_only(path: Path, options: dict[str, Options], access: AccessType) -> Rdict:
    """A read-only open that writes nothing under ``path``.

    rocksdict (up to 0.3.29 at least) rewrites ``rocksdict-config.json`` in the directory it
    opens, whatever the access type; a read-only open would then fail on a read-only
    projection and change its files. So RocksDB opens a private scratch directory of
    symlinks to the partition's files instead (rocksdict's file lands there), which is
    removed once the database is open: with ``max_open_files=-1`` a read-only instance
    opens every table file at once and never reads CURRENT, the MANIFEST or the WAL again.
    Where no scratch directory can be made, the partition is opened in place.
    """
    import shutil
    import tempfile

    try:
        scratch = Path(tempfile.mkdtemp(prefix="effectlog-read-"))
    except OSError:
        return Rdict(str(path), _db_options("read_only"), column_families=options,
                     access_type=access)
    try:
        for name in os.listdir(path):
            if name not in _NOT_LINKED and not name.startswith("LOG"):
                os.symlink(path.absolute() / name, scratch / name)
        return Rdict(str(scratch), _db_options("read_only"), column_families=options,
                     access_type=access)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


#: Files of a partition a read-only instance never reads (its info LOG files aside).
_NOT_LINKED = frozenset({"LOCK", "rocksdict-config.json"})


class PartitionDB:
    """One opened partition: the database and its column families by name."""

    def __init__(self, partition: int, path: Path, mode: Mode,
                 families: tuple[str, ...] = COLUMN_FAMILIES) -> None:
        self.partition = partition
        self.mode: Mode = mode
        self.secondary_dir: str | None = None
        if mode == "secondary":
            import tempfile

            self.secondary_dir = tempfile.mkdtemp(prefix="effectlog-secondary-")
        self.db = open_partition(path, mode, self.secondary_dir, families)
        self.cf = {name: self.db.get_column_family(name)
                   for name in (COLUMN_FAMILIES if mode == "write" else families)}

    def catch_up(self) -> None:
        """A secondary instance replays what the primary wrote since (no-op otherwise)."""
        if self.mode != "secondary":
            return
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


def read_counts(metadata: Rdict) -> dict[str, int]:
    """The ``count:`` entries of a partition's metadata column family."""
    counts: dict[str, int] = {}
    for name, value in metadata.items(from_key=COUNT_PREFIX):
        label = cast(bytes, name)
        if not label.startswith(COUNT_PREFIX):
            break
        counts[label[len(COUNT_PREFIX):].decode("utf-8")] = unpack_i64(value)
    return counts
