"""How many replicas ``topics create`` gives the topics, and what it asks of existing ones.

At-most-once rests on Kafka's own promise: an append acknowledged with ``acks=all`` is on every
in-sync replica, and a replica that missed it never becomes leader. That promise holds through a
broker's loss only with several replicas, ``min.insync.replicas`` of at least two (else the ISR
may shrink to the leader alone, and an acknowledged append lives on one disk) and no unclean
leader election (else an out-of-sync replica may lead and drop acknowledged records, so an
existing topic that allows it is a conflict, as ``serve`` refuses it). So on a cluster of three
or more brokers, or one whose brokers' configs call for three replicas, the topics get
replication 3, ``min.insync.replicas=2`` and ``unclean.leader.election.enable=false`` unless the
log URL says otherwise; fewer brokers answering than that is :attr:`Durability.short` (refused by
``topics create``); on a smaller cluster the topics keep one replica, and :attr:`Durability.why`
says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from effectlog.log.kafka.settings import KafkaSettings

#: The topic config that lets an out-of-sync replica lead, and what it costs: refused on
#: effectlog's topics, by ``topics create`` and by ``serve``.
UNCLEAN = "unclean.leader.election.enable"
UNCLEAN_LOSES = (f"has {UNCLEAN}=true: a replica that missed acknowledged appends may become "
                 "leader and take them back, verdicts given on them included")

#: The smallest cluster whose topics are replicated by default, and what they get there.
REPLICATED_FROM_BROKERS = 3
REPLICATION = 3


def majority(replication: int) -> int:
    """The default ``min.insync.replicas`` of ``replication`` replicas (3 -> 2, 5 -> 3)."""
    return replication // 2 + 1


@dataclass(frozen=True, slots=True)
class Durability:
    """The replication of the topics on a cluster of ``brokers``; ``told`` when the log URL set
    it (then an existing topic that falls short is a conflict, not a warning)."""

    brokers: int
    replication: int
    min_insync: int | None  # None: the broker's default (one replica needs no quorum)
    told: bool
    why: str
    short: bool = False  # fewer brokers answer than the intended replication (not told)

    def configs(self) -> dict[str, str]:
        """Topic configs that go with the replication (none for a single replica)."""
        configs = {}
        if self.min_insync is not None:
            configs["min.insync.replicas"] = str(self.min_insync)
        if self.replication > 1:
            configs[UNCLEAN] = "false"
        return configs

    def review(self, replicas: list[int], config: dict[str, str]) -> Review:
        """What an existing topic (replicas per partition, its configs) lacks of this plan."""
        review = Review()
        found = min(replicas) if replicas else 0
        if found < self.replication:
            (review.conflicts if self.told else review.warnings).append(
                f"has {found} replica{'s' * (found != 1)}, "
                + (f"settings say {self.replication}" if self.told else
                   f"a cluster of {self.brokers} brokers calls for {self.replication}"))
        insync = int(config.get("min.insync.replicas", "1"))
        if found and insync > found:
            review.conflicts.append(f"min.insync.replicas={insync} exceeds its {found} "
                                    "replicas: every acks=all append would be refused")
        elif self.min_insync is not None and insync < self.min_insync <= found:
            (review.conflicts if self.told else review.warnings).append(
                f"min.insync.replicas={insync} is below {self.min_insync}: an acknowledged "
                "append may be on fewer brokers")
        if config.get(UNCLEAN, "false") == "true":  # what serve refuses to judge on
            review.conflicts.append(f"{UNCLEAN_LOSES}; set it to false")
        return review


@dataclass
class Review:
    """An existing topic's shortfalls: ``conflicts`` always refuse it (exit 3), ``warnings``
    only with ``--strict``."""

    conflicts: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def plan(settings: KafkaSettings, brokers: int, configured: int = 1) -> Durability:
    """The replication for a cluster of ``brokers`` answering now, whose brokers' configs call
    for ``configured`` replicas (see :func:`effectlog.log.kafka.admin.create_topics`); from the
    URL where it says so. The intended replication (3 on 3 or more brokers, else
    ``min(3, configured)``) may exceed the brokers answering: :attr:`Durability.short` says so,
    and ``topics create`` then refuses to create topics rather than settle for fewer."""
    told = settings.replication is not None or settings.min_insync_replicas is not None
    replicated = brokers >= REPLICATED_FROM_BROKERS
    intended = max(REPLICATION if replicated else 1, min(REPLICATION, configured))
    replication = settings.replication or intended
    min_insync = settings.min_insync_replicas
    if min_insync is None and replication > 1:
        min_insync = majority(replication)
    shown = f"replication {replication}" + "".join(
        f", {k}={v}" for k, v in Durability(brokers, replication, min_insync, told, "")
        .configs().items())
    size = f"{brokers} broker{'s' * (brokers != 1)}"
    if told:
        why = f"{shown}: from the log URL (the cluster has {size})"
    elif replicated:
        why = (f"{shown}: the cluster has {size}, so an acknowledged append is on at least "
               f"{min_insync} of them and survives the loss of any one")
    elif replication > 1:
        why = (f"{shown}: the brokers' default.replication.factor or "
               f"offsets.topic.replication.factor call for {configured}, and {size} answer")
    else:
        why = (f"{shown}: the cluster has {size}; replicated topics need "
               f"{REPLICATED_FROM_BROKERS} (set replication= in the log URL to choose)")
    return Durability(brokers, replication, min_insync, told, why,
                      short=settings.replication is None and brokers < replication)
