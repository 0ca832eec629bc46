"""The RocksDB projection store: one database per assigned partition under a state directory.

Writers are opened when a partition is assigned to this process and released when it is
revoked; :meth:`RocksProjectionStore.reader` reads the open databases directly, so it sees
every committed batch at once (no secondary catch-up), from any thread.
"""

from __future__ import annotations

import gc
import os
import threading
from collections.abc import Callable, Collection, Mapping
from pathlib import Path

from effectlog.errors import BackendUnavailable
from effectlog.private_fs import make_private_dirs
from projections.rocksdb import layout
from projections.rocksdb.db import PartitionDB, ProjectionLocked
from projections.rocksdb.reader import Partitioner, PartitionReads, default_partitioner
from projections.rocksdb.writer import RocksPartitionWriter
from projections.store import ProjectionStore


class RocksProjectionStore(ProjectionStore):
    """Partitions of the projection under ``state_dir`` (its current generation)."""

    def __init__(self, state_dir: str | os.PathLike[str], cache_size: int = 50_000) -> None:
        self.state_dir = Path(state_dir)
        self.cache_size = cache_size
        self.generation: Path | None = None
        self._writers: dict[int, RocksPartitionWriter] = {}
        self._lock = threading.Lock()  # open/release against readers listing the partitions
        self._partitions = 0

    def open_writer(self, partition: int, *, partitions: int) -> RocksPartitionWriter:
        with self._lock:
            if partition in self._writers:
                raise BackendUnavailable(f"partition {partition} is already open for writing")
            if self.generation is None:
                self.generation = layout.ensure_generation(self.state_dir)
            layout.record_partition_count(self.generation, partitions)
            self._partitions = partitions
            path = make_private_dirs(layout.partition_dir(self.generation, partition))
            try:
                writer = RocksPartitionWriter(path, partition, self.cache_size)
            except ProjectionLocked as exc:
                if "current process" not in str(exc):
                    raise
                # a released writer of ours still referenced from a reference cycle (an
                # exception's frames): collecting it closes the database
                gc.collect()
                writer = RocksPartitionWriter(path, partition, self.cache_size)
            self._writers[partition] = writer
            return writer

    def reset_writer(self, partition: int, *, partitions: int) -> RocksPartitionWriter:
        with self._lock:
            writer = self._writers.get(partition)
        if writer is None:
            return self.open_writer(partition, partitions=partitions)
        writer.clear()
        return writer

    def release(self, partition: int) -> None:
        with self._lock:
            writer = self._writers.pop(partition, None)
            if not self._writers:
                self.generation = None  # the next open follows a swapped-in generation
        if writer is not None:
            writer.close()

    @property
    def partition_count(self) -> int:
        """Partitions of the events topic, as the last writer opened was told."""
        return self._partitions

    def writers(self) -> dict[int, RocksPartitionWriter]:
        """The partitions open for writing, by number."""
        with self._lock:
            return dict(self._writers)

    def outdated(self) -> bool:
        current = layout.current_generation(self.state_dir)
        return self.generation is not None and current is not None and current != self.generation

    def reader(self, partition_for: Partitioner | None = None,
               visible: Callable[[], Collection[int]] | None = None) -> StoreReader:
        """A reader of the open partitions; ``visible`` narrows them (e.g. to those a
        node serves, leaving out partitions still restoring)."""
        return StoreReader(self, partition_for, visible)

    def close(self) -> None:
        for partition in list(self.writers()):
            self.release(partition)


class StoreReader(PartitionReads):
    """Reads the partitions a :class:`RocksProjectionStore` has open for writing (those
    ``visible`` returns, when given)."""

    def __init__(self, store: RocksProjectionStore, partition_for: Partitioner | None,
                 visible: Callable[[], Collection[int]] | None = None) -> None:
        self.store = store
        self._partition_for = partition_for
        self._visible = visible

    def _writers(self) -> dict[int, RocksPartitionWriter]:
        writers = self.store.writers()
        if self._visible is None:
            return writers
        shown = self._visible()
        return {p: w for p, w in writers.items() if p in shown}

    @property
    def exists(self) -> bool:
        return bool(self._writers())

    def partition_of(self, key: str) -> int:
        if self._partition_for is None:
            self._partition_for = default_partitioner(self.store.partition_count)
        return self._partition_for(key)

    def _opened(self) -> Mapping[int, PartitionDB]:
        return {p: w.handle for p, w in self._writers().items()}

    def _one(self, partition: int) -> PartitionDB | None:
        writer = self._writers().get(partition)
        return None if writer is None else writer.handle

    def _generation_of(self, partition: int) -> str:
        writer = self._writers().get(partition)
        return "" if writer is None else writer.path.parent.name
