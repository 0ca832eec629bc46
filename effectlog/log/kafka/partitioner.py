"""Kafka's key hash: the Java client's ``murmur2`` partitioner.

Producers are configured with ``partitioner=murmur2_random`` (the same hash), so any process,
the CLI included, computes a key's partition without asking a broker.
"""

from __future__ import annotations

import struct
from functools import lru_cache


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 (the Java client's ``Utils.murmur2``) as a signed 32-bit int."""
    m, mask = 0x5BD1E995, 0xFFFFFFFF
    length = len(data)
    h = (0x9747B28C ^ length) & mask
    whole = length - length % 4
    for (k,) in struct.iter_unpack("<I", data[:whole]):
        k = (k * m) & mask
        k ^= k >> 24
        h = ((h * m) & mask) ^ ((k * m) & mask)
    tail = data[whole:]
    if tail:
        h ^= int.from_bytes(tail, "little")
        h = (h * m) & mask
    h ^= h >> 13
    h = (h * m) & mask
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


@lru_cache(maxsize=16_384)
def murmur2_partition(key: bytes, partitions: int) -> int:
    """The partition the Java default partitioner (and ``murmur2_random``) picks for ``key``
    (remembered for the latest keys: a worker asks for one key several times per effect)."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions
