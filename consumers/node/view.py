"""Read-your-writes for writers inside the node (the reconciler's worker): a StateView
answered from the node's own projection, waiting on the partition gate."""

from __future__ import annotations

from consumers.node.gate import PartitionGate
from effectlog.errors import BackendUnavailable
from effectlog.log.base import EVENTS, EventLog, Position
from effectlog.model import EffectEvent
from projections.store import ProjectionReader


class NodeView:
    """:class:`effectlog.view.StateView` over the partitions this node serves."""

    def __init__(self, log: EventLog, gate: PartitionGate, reader: ProjectionReader,
                 timeout_s: float = 10.0) -> None:
        self.log = log
        self.gate = gate
        self.reader = reader
        self.timeout_s = timeout_s

    def current(self, key: str) -> EffectEvent | None:
        """The key's snapshot once its partition has applied the log end seen now."""
        partition = self.log.partition_for(EVENTS, key)
        end = self.log.end_offsets(EVENTS).get(partition, 0)
        self._wait(partition, end, self.timeout_s)
        return self.reader.get(key)

    def accepted(self, event: EffectEvent, position: Position, timeout: float = 10.0) -> bool:
        """Whether the event appended at ``position`` was accepted in log order."""
        self._wait(position.partition, position.offset + 1, timeout)
        return self.reader.rejected_at(position) is None

    def _wait(self, partition: int, offset: int, timeout_s: float) -> None:
        if not self.gate.wait(partition, offset, timeout_s):
            state = self.gate.status(partition) or "not served by this node"
            raise BackendUnavailable(f"partition {partition} has not applied offset {offset} "
                                     f"within {timeout_s}s ({state})")
