"""A changelog publication and its checkpoint (store-independent; see
:mod:`effectlog.log.changelog`)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from effectlog.errors import WrongLog
from effectlog.log.changelog import Change

CHECKPOINT_FORMAT = 1


@dataclass(frozen=True, slots=True)
class Changes:
    """One publication: the changed keys' states (None: removed) as of ``applied``."""

    partition: int
    applied: int
    counts: dict[str, int]
    changes: list[Change]
    full: bool = False  # every key of the partition, not only those changed

    def checkpoint(self, log_id: str | None) -> bytes:
        """The checkpoint record: the events offset these states reflect, the counters then,
        and the identity of the events log they were judged from."""
        return json.dumps({"format": CHECKPOINT_FORMAT, "partition": self.partition,
                           "applied": self.applied, "counts": self.counts, "log_id": log_id},
                          sort_keys=True).encode("utf-8")


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A decoded checkpoint record."""

    applied: int
    counts: dict[str, int]
    log_id: str | None

    @classmethod
    def decode(cls, raw: bytes) -> Checkpoint:
        try:
            value: dict[str, Any] = json.loads(raw)
            if value.get("format") != CHECKPOINT_FORMAT:
                raise ValueError(f"checkpoint format {value.get('format')!r}")
            return cls(int(value["applied"]), {str(k): int(v) for k, v in value["counts"].items()},
                       value.get("log_id"))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise WrongLog(f"an unreadable changelog checkpoint ({exc}): the changelog is not "
                           f"effectlog's; {WrongLog.HINT}") from None
