"""Idempotency keys and payload identity (pure, no I/O)."""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from effectlog.errors import InvalidInput

MAX_KEY_BYTES = 512
#: The highest fencing epoch a writer may give: 2**53 - 1, exact in every JSON reader, and far
#: below the log's 64-bit field, so every epoch+1 the system claims after it still fits.
MAX_FENCING_EPOCH = 2**53 - 1
_OPERATION_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_KIND = re.compile(r"^[a-z][a-z0-9_.-]{0,63}$")


def _has_control(text: str) -> bool:
    """Control, format, separator (other than a plain space) or unassigned characters."""
    return not text.isprintable()


def validate_operation_id(operation_id: str) -> str:
    """An operation id: 1-128 of ``[A-Za-z0-9._-]``, no colon (it separates key parts)."""
    if not isinstance(operation_id, str) or not _OPERATION_ID.match(operation_id):
        raise InvalidInput(f"invalid operation_id {operation_id!r}: use 1-128 of [A-Za-z0-9._-]")
    return operation_id


def validate_kind(kind: str) -> str:
    """An operation kind such as ``email.send``: lower case, digits, ``._-``."""
    if not isinstance(kind, str) or not _KIND.match(kind):
        raise InvalidInput(f"invalid kind {kind!r}: use lower-case [a-z0-9._-], starting a-z")
    return kind


def validate_target(target: str) -> str:
    """A target: non-empty, no control or separator characters, no surrounding spaces."""
    if not isinstance(target, str) or not target or target != target.strip():
        raise InvalidInput(f"invalid target {target!r}: must be non-empty without outer spaces")
    if _has_control(target):
        raise InvalidInput(f"invalid target {target!r}: control characters are not allowed")
    return target


def make_key(operation_id: str, kind: str, target: str) -> str:
    """The stable idempotency key ``agent:{operation_id}:{kind}:{target}``."""
    key = (
        f"agent:{validate_operation_id(operation_id)}:{validate_kind(kind)}:"
        f"{validate_target(target)}"
    )
    return validate_key(key)


def validate_key(key: str) -> str:
    """Reject empty, over-512-byte, control-character or non-``agent:`` keys."""
    if not isinstance(key, str) or not key:
        raise InvalidInput("invalid idempotency key: empty")
    size = len(key.encode("utf-8"))
    if size > MAX_KEY_BYTES:
        raise InvalidInput(f"invalid idempotency key: {size} bytes, the limit is {MAX_KEY_BYTES}")
    if _has_control(key):
        raise InvalidInput("invalid idempotency key: control characters are not allowed")
    parts = key.split(":", 3)
    if len(parts) != 4 or parts[0] != "agent" or not all(parts[1:]):
        raise InvalidInput(f"invalid idempotency key {key!r}: expected agent:OPERATION:KIND:TARGET")
    return key


def split_key(key: str) -> tuple[str, str, str]:
    """(operation_id, kind, target) of a valid key; the target may itself contain colons."""
    _, operation_id, kind, target = validate_key(key).split(":", 3)
    return operation_id, kind, target


def validate_fencing_epoch(epoch: object) -> int:
    """A fencing epoch a writer gives: an integer from 0 to :data:`MAX_FENCING_EPOCH`."""
    if not isinstance(epoch, int) or isinstance(epoch, bool) \
            or not 0 <= epoch <= MAX_FENCING_EPOCH:
        raise InvalidInput(f"fencing_epoch must be an integer from 0 to {MAX_FENCING_EPOCH}")
    return epoch


def canonical_payload(payload: Any) -> bytes:
    """Canonical JSON bytes: sorted keys, no spaces, UTF-8, no NaN."""
    try:
        text = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                          allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidInput(f"payload is not canonical JSON: {exc}") from exc
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:  # a lone surrogate such as "\ud800" (JSON allows it)
        bad = text[exc.start:exc.end].encode("unicode_escape").decode("ascii")
        raise InvalidInput(f"payload is not valid Unicode: lone surrogate {bad}") from None


def payload_hash(payload: Any) -> str:
    """sha256 hex of the canonical payload: the payload's identity under its key."""
    return hashlib.sha256(canonical_payload(payload)).hexdigest()
