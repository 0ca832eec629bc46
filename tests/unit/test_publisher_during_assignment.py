"""The changelog publisher never publishes a partition whose assignment is still under way.

Found by the Kafka soak: a restarted serve was given a partition whose stored copy (applied up
to 109) was ahead of the changelog's last checkpoint (89); while its projector was still
deciding to restore, the publisher's round found the freshly opened writer, saw nothing
changed and next offset 109, and committed a checkpoint 109 with no keys. The next owner
restored "up to 109" without the keys changed between 89 and 109, judged a key absent that
had been dispatched, and a second delivery called the provider again.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
from pathlib import Path

from consumers.node.publisher import Publisher
from effectlog.log.base import Record
from effectlog.log.changelog import CHECKPOINT_KEY
from effectlog.log.memory import MemoryLog
from projections.checkpoint import Checkpoint
from projections.projector import Projector
from projections.rocksdb.digest import partition_digest
from tests.restore_support import RESTORED, history
from tests.unit.test_changelog_restore import CompactedLog, MemoryChangelog, _apply_upto

LOG_ID = "log-1"


class SlowChangelog(MemoryChangelog):
    """Its last checkpoint is read only once ``go`` is set (a broker slow to answer)."""

    def __init__(self) -> None:
        super().__init__()
        self.asked = threading.Event()
        self.go = threading.Event()
        self.slow = False

    def last_checkpoint(self, partition: int) -> bytes | None:
        if self.slow:
            self.asked.set()
            assert self.go.wait(10)
        return super().last_checkpoint(partition)


def records() -> list[Record]:
    from effectlog.codec import event_codec
    from effectlog.log.base import EVENTS

    codec, log = event_codec(), MemoryLog()
    for n in range(6):
        for event in history("stale_epoch", n):
            assert not isinstance(event, bytes)
            log.append(EVENTS, event.idempotency_key, codec.encode(event.to_record()))
    return log.read(EVENTS, 0, 0, 100_000)


def test_a_partition_being_restored_is_not_published_until_its_assignment_completes() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="publisher-"))
    try:
        kept = records()
        half = len(kept) // 2
        changelog = SlowChangelog()
        log = CompactedLog(kept, changelog, LOG_ID)
        # the first life: publishes up to half, applies everything, is killed unpublished
        first = Publisher(changelog, lambda: {}, LOG_ID)
        with Projector(log, tmp / "node") as projector:
            first.writers = projector.writers
            first.take([0])
            _apply_upto(projector, half)
            assert first.publish(0)
            _apply_upto(projector, len(kept))
        published_at = Checkpoint.decode(changelog.last_checkpoint(0) or b"").applied
        assert published_at == half
        # the second life: the projector opens its copy (ahead of the changelog) and asks for
        # the last checkpoint; a publication round runs meanwhile
        projector = Projector(log, tmp / "node")
        second = Publisher(changelog, projector.writers, LOG_ID)
        second.take([0])
        changelog.slow = True
        opening = threading.Thread(target=projector.assigned, args=([0],))
        opening.start()
        assert changelog.asked.wait(10)
        second.publish(0)  # the publisher's round, on its own thread in serve
        changelog.go.set()
        opening.join(10)
        changelog.slow = False
        _apply_upto(projector, len(kept))
        second.publish(0)
        projector.close()
        # a new owner restores from the changelog: exactly a full replay
        truth_dir, restored_dir = tmp / "truth", tmp / "restored"
        with Projector(CompactedLog(kept, MemoryChangelog(), LOG_ID), truth_dir) as truth:
            truth.run(once=True)
        with Projector(CompactedLog(kept, changelog, LOG_ID), restored_dir,
                       from_changelog=True) as restored:
            restored.run(once=True)
        assert partition_digest(restored_dir, 0, RESTORED) == \
            partition_digest(truth_dir, 0, RESTORED)
        checkpoints = [Checkpoint.decode(v or b"").applied
                       for k, v in changelog.records if k == CHECKPOINT_KEY]
        assert checkpoints == sorted(checkpoints)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
