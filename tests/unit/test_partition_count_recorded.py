"""A projection and a changelog remember the events topic's partition count, and refuse a
topic whose count changed (keys would move to partitions without their history)."""

from __future__ import annotations

from pathlib import Path

import pytest

from effectlog.errors import WrongLog
from projections.checkpoint import Changes, Checkpoint, check_partition_count
from projections.rocksdb.layout import partition_count, record_partition_count


def test_a_projection_refuses_another_partition_count(tmp_path: Path) -> None:
    record_partition_count(tmp_path, 2)
    record_partition_count(tmp_path, 2)  # the same count again: nothing to refuse
    with pytest.raises(WrongLog, match=r"has 4 partitions but .* was made with 2"):
        record_partition_count(tmp_path, 4)
    assert partition_count(tmp_path) == 2  # not overwritten


def test_a_checkpoint_carries_the_partition_count() -> None:
    changes = Changes(partition=1, applied=7, counts={"SUCCEEDED": 1}, changes=[])
    assert Checkpoint.decode(changes.checkpoint("log-1", 2)).partitions == 2
    assert Checkpoint.decode(changes.checkpoint("log-1")).partitions is None  # older ones
    check_partition_count(None, 4, "an older changelog")  # nothing recorded: nothing refused
    with pytest.raises(WrongLog, match="write to a new log"):
        check_partition_count(2, 4, "its changelog")
