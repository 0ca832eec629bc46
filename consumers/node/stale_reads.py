"""Reads a standby copy answers while its partition has no reachable owner.

When a member dies, the group notices only after its session timeout, and until it moves the
partitions nobody owns them. A standby copy (``serve --standbys N``) is a projection of the
same partition kept up to date a moment behind the owner, so a plain read of a key can be
answered from it at once, marked stale with how far it is behind the log (as Kafka Streams
answers interactive queries from standbys, KIP-535). Reads that need the owner (``fresh``,
``min_offset``) and every verdict still wait for the new owner: a standby never judges.

The answer carries :data:`STALE` (``1``) and :data:`LAG` (records the copy is behind the
log's end when it answered), besides the usual partition, applied-offset, served-by, topic ID
and generation headers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from projections.rocksdb.reader import ConsistentRead
from projections.rocksdb.snapshot import snapshot_json

STALE = "Effectlog-Stale"
LAG = "Effectlog-Lag"
#: The query parameter of a read forwarded to a member for its standby copy.
STANDBY = "standby"


@dataclass(frozen=True, slots=True)
class StaleRead:
    """A key read from a standby copy: the snapshot's JSON (None: unknown key there)."""

    partition: int
    applied: int
    lag: int
    snapshot: dict[str, object] | None
    served_by: str
    topic_id: str | None
    generation: str

    def headers(self) -> dict[str, str]:
        return {"Effectlog-Partition": str(self.partition),
                "Effectlog-Applied-Offset": str(self.applied),
                "Effectlog-Served-By": self.served_by, "Effectlog-Topic-Id": self.topic_id or "",
                "Effectlog-Generation": self.generation, STALE: "1", LAG: str(self.lag)}


class StandbyCopies:
    """The standby copies of one node, read consistently (key and applied offset from one
    snapshot, as the owner reads them)."""

    def __init__(self, url: str, held: Callable[[], Mapping[int, int]],
                 read: Callable[[str], ConsistentRead | None],
                 ends: Callable[[], Mapping[int, int]], topic_id: str | None = None) -> None:
        self.url = url
        self.topic_id = topic_id
        self.held = held
        self.read_consistent = read
        self.ends = ends

    def holds(self, partition: int) -> bool:
        return partition in self.held()

    def read(self, key: str) -> StaleRead | None:
        """The key from this node's standby copy of its partition (blocking: it reads the
        log's end for the lag); None when this node keeps no copy of it."""
        found = self.read_consistent(key)
        if found is None:
            return None
        end = self.ends().get(found.partition, found.applied)
        snapshot = None if found.raw is None else snapshot_json(found.raw)
        return StaleRead(found.partition, found.applied, max(0, end - found.applied), snapshot,
                         self.url, self.topic_id, found.generation)
