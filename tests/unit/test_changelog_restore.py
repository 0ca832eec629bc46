"""Restore equals replay, for any history (hypothesis), in-process.

A log with a changelog (in memory, with Kafka's semantics: a publication is all or nothing,
and taking a partition's writer fences the earlier one) receives random histories of a few
keys, with latest records rejected for every reason; its projection publishes at random
moments; then the log is compacted below the last checkpoint (each key keeps its latest
record there, at its offset) and a fresh projection restores from the changelog and replays
the rest. Its digest must equal a full replay of the uncompacted log; a replay of the
compacted log alone must not (for the histories where compaction removed an accepted state).
"""

from __future__ import annotations

import shutil
import tempfile
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from effectlog.audit import Replay
from effectlog.codec import event_codec
from effectlog.errors import Fenced
from effectlog.log.base import EVENTS, EventLog, Record
from effectlog.log.changelog import (
    CHECKPOINT_KEY,
    Change,
    Changelog,
    ChangelogWriter,
    ReadStopped,
)
from effectlog.log.memory import MemoryLog
from effectlog.verifier import Published
from projections.checkpoint import Checkpoint
from projections.projector import Projector
from projections.published import read_published
from projections.rocksdb.digest import partition_digest
from tests.restore_support import EXPIRIES, REASONS, RESTORED, history


class MemoryChangelog(Changelog):
    """One partition's publications in order; a writer works until a later one is taken."""

    def __init__(self) -> None:
        self.records: list[Change] = []
        self.generation = 0

    def writer(self, partition: int) -> ChangelogWriter:
        self.generation += 1
        return _Writer(self, self.generation)

    def read(self, partition: int, stop: threading.Event | None = None) -> Iterator[Change]:
        for change in list(self.records):
            if stop is not None and stop.is_set():
                raise ReadStopped
            yield change

    def last_checkpoint(self, partition: int) -> bytes | None:
        found = [v for k, v in self.records if k == CHECKPOINT_KEY]
        return found[-1] if found else None


class _Writer(ChangelogWriter):
    def __init__(self, changelog: MemoryChangelog, generation: int) -> None:
        self.changelog = changelog
        self.generation = generation
        self.partition = 0

    def publish(self, changes: Sequence[Change], checkpoint: bytes) -> None:
        if self.generation != self.changelog.generation:
            raise Fenced("a later owner took the partition", "zombie_owner")
        self.changelog.records.extend([*changes, (CHECKPOINT_KEY, checkpoint)])

    def close(self) -> None:
        return None


class CompactedLog(MemoryLog):
    """A compacted log with a changelog: records keep their offsets, gaps between them."""

    conditional = False
    compacted = True

    def __init__(self, records: list[Record], changelog: MemoryChangelog, log_id: str,
                 end: int | None = None) -> None:
        super().__init__()
        self.kept = records
        self._changelog = changelog
        self._log_id = log_id
        # compaction never moves a partition's end back
        self._end = end if end is not None else records[-1].offset + 1 if records else 0

    def changelog(self) -> Changelog:
        return self._changelog

    def identity(self) -> str:
        return self._log_id

    def read(self, topic: str, partition: int, offset: int, limit: int = 1000,
             timeout: float = 0.0) -> list[Record]:
        if topic != EVENTS:
            return []
        return [r for r in self.kept if r.offset >= offset][:limit]

    def end_offsets(self, topic: str) -> dict[int, int]:
        return {0: self._end if topic == EVENTS else 0}


def compact_below(records: list[Record], below: int, drop_tombstones: bool = False
                  ) -> list[Record]:
    """Kafka's cleaner with a compaction lag: below ``below`` each key keeps its latest
    record (its latest overall, when that is at or past ``below``: the older ones go);
    ``drop_tombstones``: past ``delete.retention.ms``, a tombstone kept so goes too."""
    latest = {r.key: r.offset for r in records}
    return [r for r in records if r.offset >= below or (
        latest[r.key] == r.offset and not (drop_tombstones and not r.value))]


def digest(log: EventLog, state: Path, from_changelog: bool) -> str:
    with Projector(log, state, from_changelog=from_changelog) as projector:
        projector.run(once=True)
    return partition_digest(state, 0, RESTORED)


histories = st.lists(st.tuples(st.sampled_from((*REASONS, *EXPIRIES)), st.integers(0, 3)),
                     min_size=1, max_size=10, unique=True)


@settings(max_examples=40, deadline=None)
@given(keys=histories, cuts=st.lists(st.integers(0, 60), max_size=4), data=st.data())
def test_a_restore_from_the_changelog_equals_a_full_replay(
        keys: list[tuple[str, int]], cuts: list[int], data: st.DataObject) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="restore-"))
    try:
        records = interleaved(keys, data)
        changelog = MemoryChangelog()
        log_id = "log-1"
        live = CompactedLog(records, changelog, log_id)
        owner = changelog.writer(0)
        with Projector(live, tmp / "owner") as projector:  # publishes at random moments
            for cut in sorted({min(c, len(records)) for c in cuts} | {len(records)}):
                _apply_upto(projector, cut)
                store = projector.store.writers()[0]  # type: ignore[attr-defined]
                changes = store.take_changes()
                if changes is not None:
                    owner.publish(changes.changes, changes.checkpoint(log_id))
                    store.published(changes, ok=True)
        truth = digest(CompactedLog(records, MemoryChangelog(), log_id), tmp / "truth", False)
        checkpoint = Checkpoint.decode(changelog.last_checkpoint(0) or b"")
        compacted = compact_below(records, checkpoint.applied,
                                  drop_tombstones=data.draw(st.booleans()))
        restored = digest(CompactedLog(compacted, changelog, log_id, len(records)),
                          tmp / "restored", True)
        assert restored == truth
        _audit_agrees(records, compacted, changelog, log_id, len(records),
                      exact_removals=not any(reason in EXPIRIES for reason, _ in keys))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _verdicts(log: EventLog, published: dict[int, Published] | None) -> tuple[
        dict[int, bool], Replay]:
    run = Replay(log, published=published)
    return {item.record.offset: item.violation is None for item in run if item.judged}, run


def _audit_agrees(records: list[Record], compacted: list[Record], changelog: MemoryChangelog,
                  log_id: str, end: int, exact_removals: bool) -> None:
    """``replay`` of the compacted log, judged by the owner's publication, gives each
    surviving record it judges the verdict a replay of the whole log gives it (it judges
    every one unless an expiry of its key may lie between), and counts the accepted events
    compaction removed (of the keys' current lives: exactly, without expiries)."""
    truth, _ = _verdicts(CompactedLog(records, MemoryChangelog(), log_id), None)
    log = CompactedLog(compacted, changelog, log_id, end)
    published = read_published(log, [0])
    assert published is not None and 0 in published
    audit, run = _verdicts(log, published)
    assert audit == {offset: truth[offset] for offset in audit}
    if not published[0].expired:
        assert run.summary.unjudged == 0
    removed = sum(1 for r in records if truth[r.offset] and r.offset < published[0].applied
                  and all(k.offset != r.offset for k in compacted))
    if exact_removals:
        assert run.summary.compacted_accepted == removed
    else:
        assert run.summary.compacted_accepted <= removed


def interleaved(keys: list[tuple[str, int]], data: st.DataObject) -> list[Record]:
    """The keys' histories appended in an order hypothesis draws (each key's in order)."""
    codec = event_codec()
    log = MemoryLog()
    pending = {k: list(history(*k)) for k in keys}
    while pending:
        k = data.draw(st.sampled_from(sorted(pending)))
        event = pending[k].pop(0)
        first = history(*k)[0]
        assert not isinstance(first, bytes)
        value = event if isinstance(event, bytes) else codec.encode(event.to_record())
        log.append(EVENTS, first.idempotency_key, value)
        if not pending[k]:
            del pending[k]
    return log.read(EVENTS, 0, 0, 100_000)


def _apply_upto(projector: Projector, end: int) -> None:
    """Apply the log's records below ``end``."""
    from effectlog.log.source import LogSource

    source = LogSource(projector.log, [0], until={0: end})
    source.start(projector)
    while not source.exhausted:
        if not projector.step(source):
            break
    projector.settle()


def test_a_fenced_publisher_publishes_nothing() -> None:
    changelog = MemoryChangelog()
    first = changelog.writer(0)
    second = changelog.writer(0)  # a new owner takes the partition
    with pytest.raises(Fenced):
        first.publish([(b"agent:k:x:y", b"late")], b"{}")
    second.publish([(b"agent:k:x:y", b"now")], b"{}")
    assert changelog.records == [(b"agent:k:x:y", b"now"), (CHECKPOINT_KEY, b"{}")]
