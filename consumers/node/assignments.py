"""What a node does when the group gives it partitions or takes them away."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from consumers.node.gate import PartitionGate
from consumers.node.publisher import Publisher
from effectlog.log.base import EVENTS, EventLog
from projections.projector import Projector


class Assignments:
    """Hands a source's assignments to the publisher, the projector and the gate (runs on
    the projector thread, where the group's rebalance callbacks run)."""

    def __init__(self, projector: Projector, gate: PartitionGate, publisher: Publisher | None,
                 log: EventLog) -> None:
        self.projector = projector
        self.gate = gate
        self.publisher = publisher
        self.log = log

    def assigned(self, partitions: Sequence[int]) -> Mapping[int, int]:
        """Fence earlier owners (before reading what they published), resume each partition
        or start its restore (in the background), and let the gate hold requests until it
        caught up."""
        if self.publisher is not None:
            self.publisher.take(partitions)
        starts = self.projector.assigned(partitions)
        pending = self.projector.restoring()  # opened once restored: gate.opened
        ends = self.log.end_offsets(EVENTS)
        halted = self.projector.guard.halted()  # a standby copy halted before its promotion
        for partition in partitions:
            self.gate.assigned(partition, starts[partition], ends.get(partition, 0),
                               pending=partition in pending)
            if partition in halted:
                self.gate.halt(partition, halted[partition])
        return starts

    def revoked(self, partitions: Sequence[int], *, lost: bool) -> None:
        """Stop serving them; on a cooperative hand-over, publish everything applied first
        (the next owner then restores, not replays)."""
        for partition in partitions:
            self.gate.revoked(partition)
        if self.publisher is not None:
            if not lost:
                self.projector.settle()
            self.publisher.release(partitions, final=not lost)
        self.projector.revoked(partitions, lost=lost)
