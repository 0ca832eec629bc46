"""What the HTTP adapter and the HTTP fake server agree on: paths, headers, key encoding.

The key travels in the ``Idempotency-Key`` header as a Structured Field string (quoted),
as the IETF draft specifies; characters outside printable ASCII (and ``%``, ``"``, ``\\``)
are percent-encoded first, since a structured string is ASCII only.
"""

from __future__ import annotations

import string
from urllib.parse import quote, unquote

from effectlog.errors import InvalidInput
from effectlog.keys import split_key

KEY_HEADER = "Idempotency-Key"
EPOCH_HEADER = "Fencing-Epoch"
EFFECTS_PATH = "/effects/"        # POST /effects/{operation}: perform
LOOKUP_PATH = "/lookup"           # GET /lookup with the Idempotency-Key header
CAPABILITIES_PATH = "/capabilities"  # GET: {"lookup_complete": bool, "retention_s": float}
DEFAULT_OPERATION = "default"
PROBLEM_JSON = "application/problem+json"

_SAFE = "".join(c for c in string.printable if c not in '%"\\' and c not in string.whitespace) + " "


def encode_key(key: str) -> str:
    """The header value for ``key``: a quoted structured string."""
    return '"' + quote(key, safe=_SAFE) + '"'


def decode_key(value: str | None) -> str:
    """The key from a header value; raises :class:`InvalidInput` when missing or malformed."""
    text = (value or "").strip()
    if len(text) < 3 or text[0] != '"' or text[-1] != '"' or '"' in text[1:-1]:
        raise InvalidInput("Idempotency-Key must be a quoted structured string")
    return unquote(text[1:-1])


def operation_path(operation: str) -> str:
    return EFFECTS_PATH + quote(operation or DEFAULT_OPERATION, safe="")


def operation_from_path(path: str) -> str:
    """The operation named by ``/effects/{operation}`` (``""`` for the default one)."""
    name = unquote(path[len(EFFECTS_PATH):].split("?", 1)[0])
    return "" if name == DEFAULT_OPERATION else name


def operation_of(key: str) -> str:
    """The operation type bound in an effectlog key (its kind), or ``""`` for other keys."""
    try:
        return split_key(key)[1]
    except InvalidInput:
        return ""
