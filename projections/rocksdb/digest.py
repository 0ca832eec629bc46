"""A content digest of a projection, to compare a projection with a clean rebuild."""

from __future__ import annotations

import hashlib
import json
import os
import struct
from typing import cast

from projections.rocksdb import layout
from projections.rocksdb.db import (
    CLOCK_PREFIX,
    COLUMN_FAMILIES,
    INDEX,
    METADATA,
    STATE,
    open_partition,
)
from projections.rocksdb.snapshot import snapshot_json


def projection_digest(state_dir: str | os.PathLike[str],
                      families: tuple[str, ...] = COLUMN_FAMILIES) -> str:
    """sha256 over ``families`` (default: every column family) of every partition, in key order.

    Timing-dependent metadata (keys under ``clock:``) is left out, so a projection that
    was killed and resumed any number of times digests equal to a clean rebuild.
    """
    digest = hashlib.sha256()
    generation = layout.current_generation(state_dir)
    for partition in layout.partitions_in(generation):
        _update(digest, state_dir, partition, families)
    return digest.hexdigest()


def current_states_digest(state_dir: str | os.PathLike[str]) -> str:
    """sha256 over each key's current state (its JSON view, log time included) and the
    state/time index, of every partition: what a rebuild from a compacted topic reproduces,
    where the positions of a key's compacted events, counters and rejections are gone."""
    digest = hashlib.sha256()
    generation = layout.current_generation(state_dir)
    for partition in layout.partitions_in(generation):
        assert generation is not None
        db = open_partition(layout.partition_dir(generation, partition), "read_only")
        try:
            for item_key, value in db.get_column_family(STATE).items():
                if not cast(bytes, item_key).startswith(b"\x00"):
                    digest.update(json.dumps(snapshot_json(value), sort_keys=True).encode())
            for item_key, _ in db.get_column_family(INDEX).items():
                digest.update(cast(bytes, item_key) + b"\n")
        finally:
            db.close()
    return digest.hexdigest()


def partition_digest(state_dir: str | os.PathLike[str], partition: int,
                     families: tuple[str, ...] = COLUMN_FAMILIES) -> str:
    """:func:`projection_digest` of one partition (members of a cluster hold some each);
    safe next to the partition's running writer."""
    digest = hashlib.sha256()
    _update(digest, state_dir, partition, families)
    return digest.hexdigest()


def _update(digest: hashlib._Hash, state_dir: str | os.PathLike[str], partition: int,
            families: tuple[str, ...]) -> None:
    generation = layout.current_generation(state_dir)
    assert generation is not None
    db = open_partition(layout.partition_dir(generation, partition), "read_only")
    try:
        for name in families:
            digest.update(b"%d/%s\n" % (partition, name.encode()))
            for item_key, value in db.get_column_family(name).items():
                key = cast(bytes, item_key)
                if name == METADATA and key.startswith(CLOCK_PREFIX):
                    continue
                digest.update(struct.pack(">II", len(key), len(value)))
                digest.update(key)
                digest.update(value)
    finally:
        db.close()
