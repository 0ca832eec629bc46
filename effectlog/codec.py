"""Avro single-object encoding of effect events and reconciliation commands.

A record is ``C3 01`` + the 8-byte little-endian CRC-64-AVRO fingerprint of the writer
schema's Parsing Canonical Form + the Avro binary body, as the Avro specification writes it
(so Java's ``BinaryMessageDecoder`` and every other implementation read it). The fingerprint
names the writer schema without a registry; records written with an older known schema are
resolved to the current reader schema. Earlier effectlog versions wrote the fingerprint
byte-reversed: those records are still read, and :meth:`Codec.is_legacy` tells them apart.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterable
from functools import cache
from importlib import resources
from typing import Any, cast

import fastavro
from fastavro.schema import fingerprint, to_parsing_canonical_form

from effectlog.errors import CodecError, UnknownWriterSchema

MARKER = b"\xc3\x01"
HEADER_SIZE = 10
EVENT_SCHEMA = "effect_event.v2.avsc"
COMMAND_SCHEMA = "reconciliation_command.v1.avsc"


def load_schema_text(name: str) -> dict[str, Any]:
    """The JSON of a schema shipped in ``effectlog.schemas``."""
    text = resources.files("effectlog.schemas").joinpath(name).read_text("utf-8")
    return dict(json.loads(text))


def schema_fingerprint(schema: dict[str, Any] | str) -> bytes:
    """CRC-64-AVRO fingerprint of the schema's Parsing Canonical Form: the 8 bytes of the
    single-object header, little-endian (fastavro's hex digest is already in that order)."""
    canonical = to_parsing_canonical_form(fastavro.parse_schema(schema, _write_hint=False))
    return bytes.fromhex(fingerprint(canonical, "CRC-64-AVRO"))


def record_branches(schema: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    """The fields of a parsed record schema that are a union of null and one record, with
    that record's full name. Naming the branch (fastavro's tuple notation) writes the same
    bytes without fastavro testing the value against each branch first (10 of an outcome
    event's 25 µs)."""
    found = []
    for field in schema["fields"]:
        kind = field["type"]
        if isinstance(kind, list) and len(kind) == 2 and kind[0] == "null" \
                and isinstance(kind[1], dict) and kind[1].get("type") == "record":
            found.append((str(field["name"]), str(kind[1]["name"])))
    return tuple(found)


class Codec:
    """Encodes with one writer schema; decodes any registered writer schema into it."""

    def __init__(self, schema: dict[str, Any], older: Iterable[dict[str, Any]] = ()) -> None:
        self.name = str(schema["name"])
        self.schema = fastavro.parse_schema(schema)
        self.fingerprint = schema_fingerprint(schema)
        self._writers: dict[bytes, Any] = {}
        self._record_branches = record_branches(cast(dict[str, Any], self.schema))
        #: Byte-reversed fingerprints of the known writer schemas (the pre-spec header).
        self.legacy_fingerprints: frozenset[bytes] = frozenset()
        self._register(self.fingerprint, self.schema)
        for old in older:
            self.register_writer(old)

    def register_writer(self, schema: dict[str, Any]) -> None:
        """Accept records written with ``schema`` (an older or newer compatible version)."""
        self._register(schema_fingerprint(schema), fastavro.parse_schema(schema))

    def _register(self, fingerprint: bytes, parsed: Any) -> None:
        self._writers[fingerprint] = parsed
        self.legacy_fingerprints -= {fingerprint}  # a spec-order fingerprint wins a collision
        legacy = fingerprint[::-1]
        if legacy not in self._writers:
            self._writers[legacy] = parsed
            self.legacy_fingerprints |= {legacy}

    @property
    def writer_fingerprints(self) -> frozenset[bytes]:
        """The fingerprints (spec byte order) of every writer schema this codec decodes."""
        return frozenset(self._writers) - self.legacy_fingerprints

    def is_legacy(self, data: bytes) -> bool:
        """Whether ``data``'s header names a known writer schema in the pre-spec byte order."""
        return data[2:HEADER_SIZE] in self.legacy_fingerprints

    def encode(self, record: dict[str, Any]) -> bytes:
        """Single-object encoding of ``record`` with the current schema."""
        for field, branch in self._record_branches:
            value = record.get(field)
            if isinstance(value, dict):
                record = {**record, field: (branch, value)}
        buffer = io.BytesIO()
        buffer.write(MARKER)
        buffer.write(self.fingerprint)
        try:
            fastavro.schemaless_writer(buffer, self.schema, record)
        except OverflowError as exc:  # an int beyond Avro's 64-bit long
            names = [name for name, value in record.items() if isinstance(value, int)
                     and not -2**63 <= value < 2**63] or ["a number"]
            raise CodecError(f"record does not fit schema {self.name}: {', '.join(names)} "
                             "out of the 64-bit range") from exc
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise CodecError(f"record does not fit schema {self.name}: {exc}") from exc
        return buffer.getvalue()

    def decode(self, data: bytes) -> dict[str, Any]:
        """Decode single-object bytes; raise :class:`CodecError` for anything else."""
        if len(data) < HEADER_SIZE or data[:2] != MARKER:
            raise CodecError("not an Avro single-object record (bad marker)")
        writer = self._writers.get(data[2:HEADER_SIZE])
        if writer is None:
            raise UnknownWriterSchema(
                f"unknown writer schema fingerprint {data[2:HEADER_SIZE].hex()}")
        body = io.BytesIO(data[HEADER_SIZE:])
        try:
            record = fastavro.schemaless_reader(body, writer, self.schema)
        except Exception as exc:  # fastavro raises many types on corrupt input
            raise CodecError(f"undecodable {self.name} body: {exc}") from exc
        if body.tell() != len(data) - HEADER_SIZE:
            raise CodecError("trailing bytes after the Avro body")
        if not isinstance(record, dict):
            raise CodecError("decoded value is not a record")
        return record


@cache
def event_codec() -> Codec:
    """The codec of :class:`~effectlog.model.EffectEvent` records (parsed once)."""
    return Codec(load_schema_text(EVENT_SCHEMA))


@cache
def command_codec() -> Codec:
    """The codec of reconciliation commands (parsed once)."""
    return Codec(load_schema_text(COMMAND_SCHEMA))
