"""A released RocksDB partition writer lets go of its database even while something still
refers to it (found on a three-broker cluster: a partition taken back after its bind to a
paused broker failed stayed locked by serve itself, which then never served it again; the
second time through the end-offset round that stored the failure, frames and all)."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import pytest

from effectlog.errors import BackendUnavailable
from effectlog.log.base import EventLog
from effectlog.log.kafka.ends import EndOffsetRounds
from projections.rocksdb.store import RocksProjectionStore


def test_a_partition_released_while_its_writer_is_still_referenced_opens_again(
        tmp_path: Path) -> None:
    store = RocksProjectionStore(tmp_path)
    first = store.open_writer(0, partitions=1)
    store.release(0)  # as Projector.assigned does when binding to the log fails
    again = store.open_writer(0, partitions=1)  # `first` is still referenced here
    assert again is not first and again.next_offset == 0
    store.close()


class _PausedBroker:
    """A log whose end offsets come from shared rounds that fail while the broker is paused
    (as KafkaLog's do), so the failure of the last round stays stored."""

    url = "kafka://paused"

    def __init__(self) -> None:
        self.paused = True
        self.rounds = EndOffsetRounds(self._fetch)

    def _fetch(self) -> dict[int, int]:
        if self.paused:
            raise BackendUnavailable("kafka broker 127.0.0.1:9092 unreachable")
        return {0: 0}

    def identity(self) -> str | None:
        return None

    def end_offsets(self, topic: str) -> dict[int, int]:
        return self.rounds.ends()


def test_a_bind_that_failed_on_a_paused_broker_leaves_the_partition_free_to_open_again(
        tmp_path: Path) -> None:
    store = RocksProjectionStore(tmp_path)
    log = _PausedBroker()
    writer = store.open_writer(0, partitions=1)
    with pytest.raises(BackendUnavailable):
        try:
            writer.bind_log(cast(EventLog, log))  # its frame holds a column family
        except BaseException:
            store.release(0)  # as Projector.assigned does
            raise
    # the failed round is still the last one (the broker is still paused): what it stored
    # must not hold the bind's frames, or the database stays locked by this process
    again = store.open_writer(0, partitions=1)
    log.paused = False
    again.bind_log(cast(EventLog, log))
    store.close()
