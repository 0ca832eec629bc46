"""The projection store contract: the checks any :class:`ProjectionStore` backend must pass.

In your test suite::

    from projections.testing import ProjectionStoreContract

    class TestMyStore(ProjectionStoreContract):
        def make_store(self, path):
            return MyStore(path)

``make_store(path)`` opens a store at ``path``; called twice with the same path it opens
the same projection (a second process, or a restart). The checks: a batch is read back
with its offset; a reopened partition resumes at its stored offset and skips what it
applied; one writer per partition at a time; a released partition leaves the reader and
the others stay; refused events are kept with their reason; state scans and per-key
lookups across partitions; paging a state scan by cursor.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from effectlog.codec import event_codec
from effectlog.errors import BackendUnavailable
from effectlog.log.base import EVENTS, Position, Record
from effectlog.machine import advance, new_effect
from effectlog.model import EffectEvent, Outcome, State
from effectlog.model import Transition as T
from projections.store import ProjectionStore, cursor_of


def lifecycle(n: int, worker: str = "w1") -> list[EffectEvent]:
    """create, reserve, dispatch, record of one email effect (all legal)."""
    create = new_effect(f"op{n}", "email.send", f"mailto:u{n}@example.com", {"n": n}, worker)
    reserve = advance(create, T.RESERVE, worker)
    dispatch = advance(reserve, T.DISPATCH, worker)
    return [create, reserve, dispatch,
            advance(dispatch, T.RECORD, worker, outcome=Outcome(State.SUCCEEDED, {"id": n}))]


def records(events: list[EffectEvent], partition: int = 0, start: int = 0) -> list[Record]:
    """``events`` as consecutive log records of ``partition`` from offset ``start``."""
    codec = event_codec()
    return [Record(EVENTS, partition, start + i, e.idempotency_key,
                   codec.encode(e.to_record()), e.occurred_at) for i, e in enumerate(events)]


def keys_on(partition: int, count: int, wanted: int = 1) -> list[int]:
    """Effect numbers whose keys land on ``partition`` of ``count`` (Kafka's murmur2)."""
    from effectlog.log.kafka.partitioner import murmur2_partition

    found: list[int] = []
    n = 0
    while len(found) < wanted:
        key = lifecycle(n)[0].idempotency_key
        if murmur2_partition(key.encode("utf-8"), count) == partition:
            found.append(n)
        n += 1
    return found


class ProjectionStoreContract:
    """Subclass and implement :meth:`make_store`."""

    def make_store(self, path: Path) -> ProjectionStore:
        raise NotImplementedError

    def test_applied_batch_is_read_back_with_its_offset(self, tmp_path: Path) -> None:
        store = self.make_store(tmp_path / "state")
        try:
            events = lifecycle(1)
            writer = store.open_writer(0, partitions=1)
            applied = writer.apply(records(events))
            assert (applied.records, applied.accepted, applied.rejected) == (4, 4, 0)
            assert writer.next_offset == applied.next_offset == 4
            reader = store.reader()
            assert reader.get(events[0].idempotency_key) == events[-1]
            assert reader.next_offsets() == {0: 4}
            assert reader.counts()["state:SUCCEEDED"] == 1
        finally:
            store.close()

    def test_reopened_partition_resumes_at_its_stored_offset(self, tmp_path: Path) -> None:
        events = lifecycle(2)
        batch = records(events)
        store = self.make_store(tmp_path / "state")
        store.open_writer(0, partitions=1).apply(batch[:3])
        store.close()
        again = self.make_store(tmp_path / "state")
        try:
            writer = again.open_writer(0, partitions=1)
            assert writer.next_offset == 3
            assert writer.apply(batch[:3]).records == 0  # applied before: skipped
            assert writer.apply(batch).records == 1
            assert again.reader().get(events[0].idempotency_key) == events[-1]
        finally:
            again.close()

    def test_a_partition_has_one_writer_at_a_time(self, tmp_path: Path) -> None:
        first = self.make_store(tmp_path / "state")
        second = self.make_store(tmp_path / "state")
        try:
            first.open_writer(0, partitions=2)
            with pytest.raises(BackendUnavailable):
                second.open_writer(0, partitions=2)
            second.open_writer(1, partitions=2)  # another partition is free
        finally:
            second.close()
            first.close()

    def test_released_partition_leaves_the_reader(self, tmp_path: Path) -> None:
        [n0], [n1] = keys_on(0, 2), keys_on(1, 2)
        first, second = lifecycle(n0), lifecycle(n1)
        store = self.make_store(tmp_path / "state")
        try:
            for partition, events in ((0, first), (1, second)):
                store.open_writer(partition, partitions=2).apply(records(events, partition))
            reader = store.reader()
            assert reader.get(second[0].idempotency_key) == second[-1]
            store.release(1)
            assert reader.next_offsets() == {0: 4}
            assert reader.get(second[0].idempotency_key) is None
            assert reader.get(first[0].idempotency_key) == first[-1]
        finally:
            store.close()

    def test_refused_event_is_kept_with_its_reason(self, tmp_path: Path) -> None:
        create, reserve, dispatch, _ = lifecycle(3)
        claim = advance(reserve, T.CLAIM, "w2")
        stale = replace(dispatch, event_id="stale-dispatch")  # epoch 1 after the claim of 2
        store = self.make_store(tmp_path / "state")
        try:
            writer = store.open_writer(0, partitions=1)
            applied = writer.apply(records([create, reserve, claim, stale]))
            assert (applied.accepted, applied.rejected) == (3, 1)
            rejection = store.reader().rejected_at(Position(EVENTS, 0, 3))
            assert rejection is not None and rejection.reason == "stale_epoch"
            assert store.reader().counts()["rejected:stale_epoch"] == 1
            assert store.reader().get(create.idempotency_key) == claim
        finally:
            store.close()

    def test_state_scans_merge_partitions_oldest_first(self, tmp_path: Path) -> None:
        numbers = keys_on(0, 2, 2) + keys_on(1, 2, 2)
        store = self.make_store(tmp_path / "state")
        try:
            writers = [store.open_writer(p, partitions=2) for p in (0, 1)]
            dispatched = []
            for i, n in enumerate(numbers):
                events = [replace(e, occurred_at=1000 + 10 * i + j)
                          for j, e in enumerate(lifecycle(n)[:3])]
                partition = 0 if i < 2 else 1
                writers[partition].apply(records(events, partition, writers[partition].next_offset))
                dispatched.append(events[-1])
            found = list(store.reader().scan_state(State.DISPATCHED))
            assert found == sorted(dispatched, key=lambda e: e.occurred_at)
            older = list(store.reader().scan_state(State.DISPATCHED, older_than_ms=1005))
            assert [e.idempotency_key for e in older] == [dispatched[0].idempotency_key]
        finally:
            store.close()

    def test_state_scans_resume_after_a_cursor(self, tmp_path: Path) -> None:
        numbers = keys_on(0, 2, 3) + keys_on(1, 2, 3)
        store = self.make_store(tmp_path / "state")
        try:
            writers = [store.open_writer(p, partitions=2) for p in (0, 1)]
            for i, n in enumerate(numbers):  # pairs share a time: the key breaks the tie
                events = [replace(e, occurred_at=2000 + 10 * (i // 2)) for e in lifecycle(n)[:2]]
                partition = 0 if i < 3 else 1
                writers[partition].apply(records(events, partition, writers[partition].next_offset))
            reader = store.reader()
            whole = [e.to_json() for e in reader.scan_state(State.RESERVED)]
            assert len(whole) == 6
            pages: list[list[dict[str, object]]] = []
            after: tuple[int, str] | None = None
            while len(pages) < 10:
                page = [e.to_json() for e in reader.scan_state(State.RESERVED, limit=2,
                                                                after=after)]
                if not page:
                    break
                pages.append(page)
                after = cursor_of(page[-1])
            assert [s for page in pages for s in page] == whole and len(pages) == 3
            middle = cursor_of(whole[2])
            assert [e.to_json() for e in reader.scan_state(State.RESERVED, after=middle)] \
                == whole[3:]
            older = reader.scan_state(State.RESERVED, older_than_ms=2020, after=cursor_of(whole[0]))
            assert [e.to_json() for e in older] == whole[1:4]
            assert list(reader.scan_state(State.CREATED, after=cursor_of(whole[0]))) == []
        finally:
            store.close()
