"""A changelog publication and its checkpoint (store-independent; see
:mod:`effectlog.log.changelog`)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from effectlog.errors import BackendUnavailable, WrongLog
from effectlog.log.changelog import Change, Changelog

CHECKPOINT_FORMAT = 1


@dataclass(frozen=True, slots=True)
class Changes:
    """One publication: the changed keys' states (None: removed) as of ``applied``."""

    partition: int
    applied: int
    counts: dict[str, int]
    changes: list[Change]
    full: bool = False  # every key of the partition, not only those changed

    def checkpoint(self, log_id: str | None, partitions: int | None = None) -> bytes:
        """The checkpoint record: the events offset these states reflect, the counters then,
        and the identity (and partition count) of the events log they were judged from."""
        value: dict[str, Any] = {"format": CHECKPOINT_FORMAT, "partition": self.partition,
                                 "applied": self.applied, "counts": self.counts,
                                 "log_id": log_id}
        if partitions is not None:
            value["partitions"] = partitions
        return json.dumps(value, sort_keys=True).encode("utf-8")


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A decoded checkpoint record."""

    applied: int
    counts: dict[str, int]
    log_id: str | None
    partitions: int | None = None  # the events topic's partition count (older ones: None)

    @classmethod
    def decode(cls, raw: bytes) -> Checkpoint:
        try:
            value: dict[str, Any] = json.loads(raw)
            if value.get("format") != CHECKPOINT_FORMAT:
                raise ValueError(f"checkpoint format {value.get('format')!r}")
            count = value.get("partitions")
            return cls(int(value["applied"]), {str(k): int(v) for k, v in value["counts"].items()},
                       value.get("log_id"), None if count is None else int(count))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise WrongLog(f"an unreadable changelog checkpoint ({exc}): the changelog is not "
                           f"effectlog's; {WrongLog.HINT}") from None


def check_partition_count(recorded: int | None, count: int, what: str) -> None:
    """Refuse an events topic of ``count`` partitions where ``what`` was made with
    ``recorded`` (None: not recorded, nothing to compare)."""
    if recorded is not None and recorded != count:
        raise WrongLog(
            f"the events topic has {count} partitions but {what} was made with {recorded}: a "
            "topic whose partition count changed maps keys to partitions that lack their "
            "history, and effectlog cannot judge on it; write to a new log (a new topic "
            "prefix) instead of growing the topic")


def check_changelog_partitions(changelog: Changelog, count: int, within_s: float = 30.0) -> None:
    """Refuse an events topic of ``count`` partitions whose changelog was published with
    another count (the first partition with a checkpoint that records one says). A
    changelog partition without a leader yet (a topic just created) is waited for, at most
    ``within_s``."""
    deadline = time.monotonic() + within_s
    for partition in range(count):
        while True:
            try:
                raw = changelog.last_checkpoint(partition)
                break
            except BackendUnavailable as exc:
                if isinstance(exc, WrongLog) or time.monotonic() > deadline:
                    raise
                time.sleep(0.25)
        recorded = None if raw is None else Checkpoint.decode(raw).partitions
        if recorded is not None:
            check_partition_count(recorded, count, "its changelog")
            return
