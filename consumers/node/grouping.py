"""Where a node's partitions come from, and who else serves: the consumer group on a log that
has one (Kafka), else every partition here.

:class:`Grouping` holds the source the projector reads (the group's partitions, with standby
copies when asked for), the membership requests are forwarded by, whether the group has
given this member its share yet (``/readyz``), and the reconciler's consumed offsets of the
commands topic that go with the partitions (the group's own, so they move with them; alone,
a local file).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from consumers.bookkeeping import OffsetStore, consumer_db_path
from consumers.node.forwarding import Membership, SoloMembership
from effectlog.log.base import EventLog
from effectlog.log.source import AssignmentListener, LogSource, RecordSource

if TYPE_CHECKING:
    from consumers.reconciler import CommandOffsets
    from effectlog.log.kafka.group import GroupSource
    from effectlog.log.kafka.settings import KafkaSettings
    from projections.projector import Projector


@dataclass(frozen=True, slots=True)
class GroupOptions:
    """How a node joins its group (see :class:`~consumers.node.node.NodeSettings`)."""

    group: str | None
    session_timeout_ms: int
    standbys: int


@dataclass(slots=True)
class Grouping:
    """A node's partitions and its view of the other members."""

    source: RecordSource
    membership: Membership
    group_source: GroupSource | None = None
    group: str | None = None

    @classmethod
    def alone(cls, log: EventLog, listener: AssignmentListener, url: str,
              partitions: int) -> Grouping:
        """Every partition of ``log`` here (a log without consumer groups)."""
        source = LogSource(log)
        source.start(listener)
        return cls(source, SoloMembership(url, partitions))

    @classmethod
    def join(cls, log: EventLog, listener: AssignmentListener, url: str, partitions: int,
             options: GroupOptions, projector: Projector,
             open_standby_log: Callable[[], EventLog]) -> Grouping:
        """The consumer group where ``log`` has one (Kafka), else :meth:`alone`."""
        kafka = _kafka_settings(log)
        if kafka is None:
            return cls.alone(log, listener, url, partitions)
        from effectlog.log.kafka.group import GroupMembership, GroupSettings, GroupSource

        group = GroupSettings(options.group or f"{kafka.prefix}.serve", url,
                              session_timeout_ms=options.session_timeout_ms,
                              heartbeat_interval_ms=max(100, options.session_timeout_ms // 6))
        group_source = GroupSource(kafka, group)
        source: RecordSource = group_source
        if options.standbys > 0:
            from consumers.node.standby import WithStandbys

            source = WithStandbys(group_source, open_standby_log(), projector)
        source.start(listener)
        return cls(source, GroupMembership(kafka, group), group_source, group.group)

    def joined(self) -> bool:
        """Whether the group has given this member its share (at once when alone)."""
        return self.group_source is None or self.group_source.joined.is_set()

    def command_offsets(self, state_dir: Path, keep: Callable[[Any], Any]) -> CommandOffsets:
        """The reconciler's consumed offsets of the commands topic (``keep`` registers what
        the node closes)."""
        if self.group_source is None:
            store: OffsetStore = keep(OffsetStore(consumer_db_path(state_dir, "reconciler")))
            return store
        from effectlog.log.kafka.group import GroupCommandOffsets

        return GroupCommandOffsets(self.group_source)

    def follow(self, stop: threading.Event, every_s: float, url: str, standbys: int) -> None:
        """Re-read who owns what every ``every_s``, and at once after our own rebalance;
        plan the standby copies from it."""
        rebalanced = None if self.group_source is None else self.group_source.rebalanced
        while not stop.is_set():
            self.membership.refresh()
            self._plan_standbys(url, standbys)
            if rebalanced is None:
                stop.wait(every_s)
            elif rebalanced.wait(every_s):
                rebalanced.clear()
                stop.wait(0.2)  # let the rest of the group finish the same rebalance

    def standbys(self) -> dict[int, int]:
        """The partitions kept warm here for other members, with their next offset: the open
        copies only (one still being restored is emptied and refilled: never read)."""
        from consumers.node.standby import WithStandbys

        if not isinstance(self.source, WithStandbys):
            return {}
        writers = self.source.projector.writers()
        return {p: writers[p].next_offset for p in self.source.held if p in writers}

    def _plan_standbys(self, url: str, count: int) -> None:
        from consumers.node.standby import WithStandbys, standby_partitions

        if isinstance(self.source, WithStandbys):
            self.source.want(standby_partitions(self.membership.owners(),
                                                self.membership.members(), url, count))


def _kafka_settings(log: EventLog) -> KafkaSettings | None:
    """The settings of a Kafka log (whose backend has consumer groups), else None; other
    logs are told apart without importing the Kafka client."""
    kafka = sys.modules.get("effectlog.log.kafka.log")
    if kafka is None or not isinstance(log, kafka.KafkaLog):
        return None
    settings: KafkaSettings = log.settings
    return settings
