"""Create and check the Kafka topics of an effect log (``effectlog topics create``).

``<prefix>.events`` is compacted and keeps every key's latest record for good; the
``min.compaction.lag.ms`` keeps each key's history readable through the retry and
reconciliation window; its records are stamped with the broker's clock
(``message.timestamp.type=LogAppendTime``), which recovery measures "stuck" on, never a
writer's. ``<prefix>.commands`` is a plain time-retained topic. ``<prefix>.state`` is the changelog of
accepted state (:mod:`effectlog.log.changelog`), compacted and never deleting: projections
restore from it. Configs are always set explicitly (tansu reports no config at all for topics
created without them). Every topic gets the replication :mod:`effectlog.log.kafka.durability`
picks for the cluster (3 replicas, ``min.insync.replicas=2`` on 3 or more brokers, or where the
brokers' configs call for 3: topics are not created with fewer while a broker is down), never
unclean leader election, and existing topics are checked for it: what falls short is a warning,
or a conflict with ``strict``; unclean election is always a conflict, as for ``serve``.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (  # type: ignore[attr-defined]  # re-exported, no __all__
    AdminClient,
    ConfigResource,
    NewTopic,
    ResourceType,
)

from effectlog.errors import BackendUnavailable, Conflict, InvalidInput
from effectlog.log.base import COMMANDS, EVENTS, STATE
from effectlog.log.kafka.durability import UNCLEAN, UNCLEAN_LOSES, Durability, plan
from effectlog.log.kafka.settings import KAFKA_TOPICS, KafkaSettings

log = logging.getLogger(__name__)

_BAD_REQUEST = (KafkaError.INVALID_REPLICATION_FACTOR, KafkaError.INVALID_PARTITIONS,
                KafkaError.INVALID_CONFIG, KafkaError.POLICY_VIOLATION,
                KafkaError.TOPIC_EXCEPTION, KafkaError.INVALID_REPLICA_ASSIGNMENT)


def topic_id(settings: KafkaSettings, name: str) -> str:
    """The topic ID Kafka gave ``name`` when it was created (a log's identity)."""
    from confluent_kafka import TopicCollection

    from effectlog.errors import LogMissing

    admin = AdminClient(_admin_config(settings))
    try:
        future = admin.describe_topics(TopicCollection([name]),
                                       request_timeout=settings.timeout_s)[name]
        return str(future.result(settings.timeout_s).topic_id)
    except KafkaException as exc:
        err = exc.args[0] if exc.args else None
        if isinstance(err, KafkaError) and err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
            raise LogMissing(f"kafka topic {name} does not exist on {settings.bootstrap}: "
                             "create it with `effectlog topics create`") from None
        raise _unavailable(settings, exc) from None
    except TimeoutError:  # the broker did not answer within timeout_s (it is down)
        raise BackendUnavailable(f"kafka broker {settings.bootstrap} unreachable: no answer "
                                 f"describing {name} within {settings.timeout_s:g}s") from None
    finally:
        admin.poll(0)


WRITER_CLOCK = "stamps records with the writers' clocks, which recovery would measure stuck on"


#: Broker configs that say how many replicas the cluster's operator meant topics to have.
CLUSTER_REPLICATION = ("default.replication.factor", "offsets.topic.replication.factor")


#: The shortest compaction lag of the events topic serve accepts: a restore replays the events
#: after the changelog's last checkpoint (published every second), which must still be there.
MIN_SERVING_LAG_MS = 10_000


def serving_problem(settings: KafkaSettings,
                    lag_floor_ms: int = MIN_SERVING_LAG_MS) -> str | None:
    """None when the topics keep what a serving projection rests on; else what is wrong, in
    one line: the events topic must stamp records with the broker's clock (recovery measures
    stuck on it) and keep records long enough to be published to the changelog (never
    deleted; compacted no sooner than ``lag_floor_ms``), which must exist, be compacted and
    never delete (it is the only copy of accepted state). Neither may allow unclean leader
    election (its effective value: set on the topic or inherited from the brokers), which
    could take back records a verdict was given on."""
    events, state = settings.topic(EVENTS), settings.topic(STATE)
    admin = AdminClient(_admin_config(settings))
    try:
        if state not in _replicas(admin, settings)[0]:
            return (f"kafka topic {state} (the changelog of accepted state) does not exist: "
                    "create it with `effectlog topics create`")
        configs = _describe(admin, settings, [events, state])
    finally:
        admin.poll(0)
    for name in (events, state):
        if configs[name].get(UNCLEAN, "false") == "true":
            return (f"kafka topic {name} {UNCLEAN_LOSES}: set it to false, e.g. "
                    f"kafka-configs.sh --alter --entity-type topics --entity-name {name} "
                    f"--add-config {UNCLEAN}=false")
    stamps = configs[events].get("message.timestamp.type", "CreateTime")
    if stamps != "LogAppendTime":
        return (f"kafka topic {events} {WRITER_CLOCK} (message.timestamp.type={stamps}): set "
                f"LogAppendTime, e.g. kafka-configs.sh --alter --entity-type topics "
                f"--entity-name {events} --add-config message.timestamp.type=LogAppendTime")
    policy = set(configs[events].get("cleanup.policy", "delete").replace(" ", "").split(","))
    limits = {name: int(configs[events].get(name, default)) for name, default in
              (("retention.ms", str(7 * 24 * 3600 * 1000)), ("retention.bytes", "-1"))}
    if "delete" in policy and any(limit != -1 for limit in limits.values()):
        return (f"kafka topic {events} deletes records ("
                f"{', '.join(f'{k}={v}' for k, v in limits.items())}) whether or not they "
                f"reached the changelog: set both to -1 (compaction is what keeps it small)")
    lag = int(configs[events].get("min.compaction.lag.ms", "0"))
    if "compact" in policy and lag < lag_floor_ms:
        return (f"kafka topic {events} may compact records {lag} ms after they are written, "
                f"before they reach the changelog: set min.compaction.lag.ms to at least "
                f"{lag_floor_ms} (the reconciliation window is better)")
    policy = set(configs[state].get("cleanup.policy", "delete").replace(" ", "").split(","))
    if policy != {"compact"}:
        return (f"kafka topic {state} must be compacted and never delete (cleanup.policy="
                f"{','.join(sorted(policy))}): it is the only copy of accepted state")
    return None


def compaction_lag_ms(settings: KafkaSettings) -> int | None:
    """The events topic's ``min.compaction.lag.ms`` as the brokers have it (None when the
    topic is not compacted)."""
    events = settings.topic(EVENTS)
    admin = AdminClient(_admin_config(settings))
    try:
        config = _describe(admin, settings, [events])[events]
    finally:
        admin.poll(0)
    if "compact" not in config.get("cleanup.policy", "delete"):
        return None
    return int(config.get("min.compaction.lag.ms", "0"))


def topic_configs(settings: KafkaSettings, logical: str) -> dict[str, str]:
    """The topic configs effectlog creates ``logical`` (``events``/``commands``) with."""
    if logical == EVENTS:
        return {"cleanup.policy": "compact",
                "min.compaction.lag.ms": str(settings.min_compaction_lag_ms),
                "retention.ms": "-1",
                "message.timestamp.type": "LogAppendTime"}
    if logical == COMMANDS:
        return {"cleanup.policy": "delete",
                "retention.ms": str(settings.commands_retention_ms),
                "min.compaction.lag.ms": "0"}
    if logical == STATE:
        return {"cleanup.policy": "compact", "retention.ms": "-1",
                "min.compaction.lag.ms": "0"}
    raise InvalidInput(f"unknown topic {logical!r}")


class TopicsReport(list[str]):
    """One line per topic saying what was done; ``durability`` says which replication the
    topics get and why, ``warnings`` what existing topics lack of it."""

    def __init__(self, lines: list[str], durability: Durability, warnings: list[str]) -> None:
        super().__init__(lines)
        self.durability = durability
        self.warnings = warnings


def create_topics(settings: KafkaSettings, *, strict: bool = False) -> TopicsReport:
    """Create the events, commands and state (changelog) topics unless they exist, and
    check those that do.

    Raises :class:`Conflict` when an existing topic contradicts ``settings`` (or, with
    ``strict``, lacks the replication the cluster calls for) and :class:`BackendUnavailable`
    when the broker cannot be reached.
    """
    admin = AdminClient(_admin_config(settings))
    try:
        names = {settings.topic(t): t for t in KAFKA_TOPICS}
        existing, brokers = _replicas(admin, settings)
        durability = plan(settings, len(brokers), _configured(admin, settings, brokers))
        missing = [name for name in names if name not in existing]
        if missing and durability.short:  # a broker down: never settle for fewer replicas
            raise BackendUnavailable(
                f"kafka topics {', '.join(missing)} not created: {_brokers(brokers)} answer, "
                f"fewer than the {durability.replication} replicas the brokers' "
                f"{' or '.join(CLUSTER_REPLICATION)} call for; start the missing brokers and "
                "run it again, or set replication= in the log URL to choose")
        created, raced = _create(admin, settings, durability, names, missing)
        if created:
            _wait_visible(admin, settings, created)
        present = [name for name in names if name not in created]
        if raced:
            existing, _ = _replicas(admin, settings)
        configs = _describe(admin, settings, present)
        report, warnings = [], []
        for name, logical in names.items():
            if name in created:
                shown = ", ".join(f"{k}={v}" for k, v in
                                  _configs(settings, durability, logical).items())
                report.append(f"created {name} ({settings.partitions} partitions, "
                              f"replication {durability.replication}, {shown})")
            else:
                lacks = _check(settings, durability, name, logical, existing[name],
                               configs[name])
                warnings += [f"kafka topic {name} {w}" for w in lacks]
                state = f"{len(lacks)} warning{'s' * (len(lacks) != 1)}" if lacks else "config ok"
                report.append(f"exists {name} ({len(existing[name])} partitions, {state})")
        if strict and warnings:
            raise Conflict("; ".join(warnings) + " (refused with --strict)")
        for line in [durability.why, *report]:
            log.info("%s", line)
        return TopicsReport(report, durability, warnings)
    finally:
        admin.poll(0)  # serve queued client log lines


def answers(settings: KafkaSettings, timeout_s: float) -> bool:
    """True when a broker answers a metadata request within ``timeout_s``."""
    admin = AdminClient(_admin_config(settings))
    try:
        admin.list_topics(timeout=timeout_s)
        return True
    except KafkaException:
        return False


def _configs(settings: KafkaSettings, durability: Durability, logical: str) -> dict[str, str]:
    """What a topic is created with: its own configs and the replication's, and never unclean
    leader election, even on one replica (a broker default of true would make serve refuse
    the topics)."""
    return {**topic_configs(settings, logical), **durability.configs(), UNCLEAN: "false"}


def _admin_config(settings: KafkaSettings) -> dict[str, Any]:
    return settings.client_config()


def _unavailable(settings: KafkaSettings, exc: BaseException) -> BackendUnavailable:
    err = exc.args[0] if exc.args else exc
    detail = err.str() if isinstance(err, KafkaError) else str(exc)
    return BackendUnavailable(f"kafka broker {settings.bootstrap} unreachable: {detail}")


def _replicas(admin: AdminClient, settings: KafkaSettings
              ) -> tuple[dict[str, list[int]], list[int]]:
    """Replica count per partition of each existing topic, and the ids of the brokers that
    answer (the metadata lists no broker that is down)."""
    try:
        meta = admin.list_topics(timeout=settings.timeout_s)
    except KafkaException as exc:
        raise _unavailable(settings, exc) from None
    return ({name: [len(p.replicas) for p in topic.partitions.values()]
             for name, topic in meta.topics.items() if topic.error is None}, sorted(meta.brokers))


def _configured(admin: AdminClient, settings: KafkaSettings, brokers: list[int]) -> int:
    """The replication the brokers' own configs call for: the largest of
    :data:`CLUSTER_REPLICATION` on a broker that answers (1 where none is reported, as on
    tansu). It tells a cluster of three with one broker down from a cluster of two."""
    if not brokers:
        return 1
    resource = ConfigResource(ResourceType.BROKER, str(brokers[0]))
    try:
        future = next(iter(admin.describe_configs(
            [resource], request_timeout=settings.timeout_s).values()))
        entries = future.result(settings.timeout_s)
    except (KafkaException, TimeoutError) as exc:
        log.warning("cannot read the configs of kafka broker %d (%s): the replication goes by "
                    "the brokers that answer", brokers[0], exc)
        return 1
    return max([1, *(int(entry.value) for name, entry in entries.items()
                     if name in CLUSTER_REPLICATION and (entry.value or "").isdigit())])


def _brokers(ids: list[int]) -> str:
    return f"{len(ids)} broker{'s' * (len(ids) != 1)} ({', '.join(map(str, ids))})"


def _create(admin: AdminClient, settings: KafkaSettings, durability: Durability,
            names: dict[str, str], missing: list[str]) -> tuple[list[str], list[str]]:
    """Create ``missing``; returns (created, created meanwhile by someone else)."""
    if not missing:
        return [], []
    new = [NewTopic(name, num_partitions=settings.partitions,
                    replication_factor=durability.replication,
                    config=_configs(settings, durability, names[name])) for name in missing]
    futures = admin.create_topics(new, operation_timeout=settings.timeout_s,
                                  request_timeout=settings.timeout_s)
    created, raced = [], []
    for name, future in futures.items():
        try:
            future.result()
            created.append(name)
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            code = err.code() if isinstance(err, KafkaError) else None
            if code == KafkaError.TOPIC_ALREADY_EXISTS:
                raced.append(name)
            elif code in _BAD_REQUEST and isinstance(err, KafkaError):
                raise InvalidInput(f"cannot create kafka topic {name}: {err.str()}") from None
            else:
                raise _unavailable(settings, exc) from None
    return created, raced


def _wait_visible(admin: AdminClient, settings: KafkaSettings, names: list[str]) -> None:
    """Wait until new topics show up in metadata with a leader for every partition."""
    deadline = time.monotonic() + settings.timeout_s
    while True:
        try:
            meta = admin.list_topics(timeout=settings.timeout_s)
        except KafkaException as exc:
            raise _unavailable(settings, exc) from None
        ready = all(
            name in meta.topics and meta.topics[name].error is None
            and len(meta.topics[name].partitions) == settings.partitions
            and all(p.leader >= 0 for p in meta.topics[name].partitions.values())
            for name in names)
        if ready:
            return
        if time.monotonic() > deadline:
            raise BackendUnavailable(f"kafka topics {', '.join(names)} created but not visible "
                                     f"within {settings.timeout_s}s")
        time.sleep(0.1)


def _describe(admin: AdminClient, settings: KafkaSettings,
              names: list[str]) -> dict[str, dict[str, str]]:
    """Config values of existing topics (name -> {key: value}, unset keys absent)."""
    if not names:
        return {}
    resources = [ConfigResource(ResourceType.TOPIC, name) for name in names]
    futures = admin.describe_configs(resources, request_timeout=settings.timeout_s)
    out: dict[str, dict[str, str]] = {}
    for resource, future in futures.items():
        try:
            entries = future.result()
        except KafkaException as exc:
            raise _unavailable(settings, exc) from None
        out[resource.name] = {k: e.value for k, e in entries.items() if e.value is not None}
    return out


def _check(settings: KafkaSettings, durability: Durability, name: str, logical: str,
           replicas: list[int], config: dict[str, str]) -> list[str]:
    """Raise :class:`Conflict` naming every way an existing topic contradicts the settings;
    returns what it lacks of the replication the cluster calls for (warnings)."""
    problems = []
    if len(replicas) != settings.partitions:
        problems.append(f"has {len(replicas)} partitions, settings say {settings.partitions}")
    review = durability.review(replicas, config)
    problems += review.conflicts
    # Kafka reports every config; tansu reports none for topics created without explicit
    # configs, so an absent key means the broker default (delete, 0, 7 days).
    policy = set(config.get("cleanup.policy", "delete").replace(" ", "").split(","))
    retention = int(config.get("retention.ms", str(7 * 24 * 3600 * 1000)))
    lag = int(config.get("min.compaction.lag.ms", "0"))
    if logical == EVENTS:
        if "compact" not in policy:
            problems.append(f"is not compacted (cleanup.policy={','.join(sorted(policy))})")
        elif "delete" in policy and retention != -1:
            problems.append(f"deletes records after retention.ms={retention}")
        if lag < settings.min_compaction_lag_ms:
            problems.append(f"min.compaction.lag.ms={lag} is below the required "
                            f"{settings.min_compaction_lag_ms}")
        stamps = config.get("message.timestamp.type", "CreateTime")
        if stamps != "LogAppendTime":
            problems.append(f"{WRITER_CLOCK} (message.timestamp.type={stamps}); set "
                            "LogAppendTime: kafka-configs.sh --alter --entity-type topics "
                            f"--entity-name {name} --add-config "
                            "message.timestamp.type=LogAppendTime")
    elif logical == STATE:
        if "compact" not in policy or "delete" in policy:
            problems.append("must be compacted and never delete (cleanup.policy=compact): it "
                            f"is the only copy of accepted state (cleanup.policy="
                            f"{','.join(sorted(policy))})")
    else:
        if "compact" in policy:
            problems.append("is compacted; commands need cleanup.policy=delete")
        if retention != -1 and retention < settings.commands_retention_ms:
            problems.append(f"retention.ms={retention} is below the required "
                            f"{settings.commands_retention_ms}")
    if problems:
        raise Conflict(f"kafka topic {name} contradicts the settings: {'; '.join(problems)}")
    return review.warnings
