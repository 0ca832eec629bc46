"""A released RocksDB partition writer lets go of its database even while something still
refers to it (found on a three-broker cluster: a partition taken back after its bind to a
paused broker failed stayed locked by serve itself, which then never served it again)."""

from __future__ import annotations

from pathlib import Path

from projections.rocksdb.store import RocksProjectionStore


def test_a_partition_released_while_its_writer_is_still_referenced_opens_again(
        tmp_path: Path) -> None:
    store = RocksProjectionStore(tmp_path)
    first = store.open_writer(0, partitions=1)
    store.release(0)  # as Projector.assigned does when binding to the log fails
    again = store.open_writer(0, partitions=1)  # `first` is still referenced here
    assert again is not first and again.next_offset == 0
    store.close()
