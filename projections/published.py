"""What the owners of a compacted log's partitions last published, read for audits.

``replay`` and ``history`` judge a compacted log's records by it (see
:mod:`effectlog.verifier`): the changelog holds each key's accepted state with the positions
of its accepted events, and the checkpoint says up to which events offset.
"""

from __future__ import annotations

from collections.abc import Iterable

from effectlog.errors import LogMissing, WrongLog
from effectlog.log.base import EventLog
from effectlog.log.changelog import CHECKPOINT_KEY
from effectlog.stats import EXPIRED
from effectlog.verifier import Published, PublishedKey
from projections.checkpoint import Checkpoint
from projections.rocksdb.snapshot import MAX_ACCEPTED, decode_stored


def read_published(log: EventLog, partitions: Iterable[int],
                   key: str | None = None) -> dict[int, Published] | None:
    """Each partition's last publication (only ``key``'s state when given); partitions
    nothing was published for are left out. None when the log has no changelog (it keeps
    every record) or its changelog topic does not exist."""
    changelog = log.changelog()
    if changelog is None:
        return None
    wanted = None if key is None else key.encode("utf-8")
    identity = log.identity()
    found: dict[int, Published] = {}
    try:
        for partition in partitions:
            checkpoint: bytes | None = None
            states: dict[bytes, bytes] = {}
            for name, value in changelog.read(partition):
                if name == CHECKPOINT_KEY:
                    checkpoint = value
                elif wanted is None or name == wanted:
                    if value is None:
                        states.pop(name, None)
                    else:
                        states[name] = value
            if checkpoint is None:
                continue
            decoded = Checkpoint.decode(checkpoint)
            if decoded.log_id is not None and identity is not None and decoded.log_id != identity:
                raise WrongLog(f"the changelog of partition {partition} was published from "
                               f"another events log ({decoded.log_id}, not {identity})")
            found[partition] = Published(partition, decoded.applied,
                                         {name.decode("utf-8"): _key(raw)
                                          for name, raw in states.items()},
                                         decoded.counts.get(EXPIRED, 0))
    except LogMissing:
        return None
    finally:
        changelog.close()
    return found


def _key(raw: bytes) -> PublishedKey:
    stored = decode_stored(raw)
    return PublishedKey(stored.event, stored.accepted, len(stored.accepted) >= MAX_ACCEPTED)
