"""The lines ``effectlog append`` reads: one JSON object per transition, checked whole.

A line is refused (exit 2, one line naming the field) rather than partly used: an unknown or
misspelt field, a field its transition does not take, a ``create`` without its payload, an
empty worker id or a fencing epoch out of range would otherwise be dropped without a word.
"""

from __future__ import annotations

import json
from typing import Any

from effectlog.errors import InvalidInput
from effectlog.keys import canonical_payload, make_key, validate_fencing_epoch
from effectlog.text import check_free_text, shorten
from effectlog.worker.core import MAX_WORKER_ID

TRANSITIONS = ("create", "reserve", "claim", "dispatch", "record", "unknown", "await_approval")
REQUIRED = ("operation_id", "kind", "target", "transition", "worker_id")
#: Fields besides REQUIRED, and the transitions that take each.
OPTIONAL: dict[str, tuple[str, ...]] = {
    "payload": TRANSITIONS,
    "payload_ref": ("create",),
    "fencing_epoch": TRANSITIONS[1:],
    "outcome": ("record",),
    "error": ("unknown", "await_approval"),
}
OUTCOME_FIELDS = ("status", "result")


def parse_line(number: int, line: str) -> dict[str, Any]:
    """The request of line ``number``; :class:`InvalidInput` prefixed ``line N:`` if bad."""
    try:
        request = json.loads(line, object_pairs_hook=_no_repeated_names)
    except json.JSONDecodeError as exc:
        raise InvalidInput(f"line {number}: invalid JSON: {exc.msg} at column {exc.colno}") from exc
    except RecursionError:
        raise InvalidInput(f"line {number}: JSON nested too deeply") from None
    except ValueError as exc:  # a repeated name, or an integer of more than 4,300 digits
        raise InvalidInput(f"line {number}: {exc}") from None
    try:
        return check_request(request)
    except InvalidInput as exc:
        raise InvalidInput(f"line {number}: {exc}") from None


def check_request(request: object) -> dict[str, Any]:
    """``request`` if it is a whole, well-formed append line; :class:`InvalidInput` naming
    the first field that is not."""
    if not isinstance(request, dict):
        raise InvalidInput("expected a JSON object")
    unknown = [name for name in request if name not in REQUIRED and name not in OPTIONAL]
    if unknown:
        raise InvalidInput(f"unknown field {shorten(unknown[0])}; the fields are "
                           f"{', '.join((*REQUIRED, *OPTIONAL))}")
    name = request.get("transition")
    if not isinstance(name, str) or name.strip().lower() not in TRANSITIONS:
        raise InvalidInput(f"unknown transition {name!r}; use one of {', '.join(TRANSITIONS)}")
    transition = name.strip().lower()
    for field in REQUIRED:
        if not isinstance(request.get(field), str):
            raise InvalidInput(f"{field!r} is required and must be a string")
    check_free_text("worker_id", request["worker_id"], max_chars=MAX_WORKER_ID)
    make_key(request["operation_id"], request["kind"], request["target"])
    for field, takers in OPTIONAL.items():
        if request.get(field) is not None and transition not in takers:
            raise InvalidInput(f"{field!r} is not taken by {transition} (only by "
                               f"{', '.join(takers)})")
    if request.get("fencing_epoch") is not None:
        validate_fencing_epoch(request["fencing_epoch"])
    for field in ("payload_ref", "error"):  # an empty error takes the default reason
        if request.get(field) is not None:
            _check_text(field, request[field], empty=field == "error")
    if transition == "create" and "payload" not in request and request.get("payload_ref") is None:
        raise InvalidInput("create needs 'payload' (any JSON, null included) or 'payload_ref'")
    if transition == "record":
        _check_outcome(request.get("outcome"))
    return request


def _check_text(field: str, value: object, *, empty: bool) -> None:
    if not isinstance(value, str) or not (value or empty):
        raise InvalidInput(f"{field!r} must be a {'' if empty else 'non-empty '}string")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:  # a lone surrogate such as "\ud800" (JSON allows it)
        bad = value[exc.start:exc.end].encode("unicode_escape").decode("ascii")
        raise InvalidInput(f"{field!r} is not valid Unicode: lone surrogate {bad}") from None


def _no_repeated_names(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object whose names are all different: a repeated one would keep its last value only
    (a line taken in part)."""
    found: dict[str, Any] = {}
    for name, value in pairs:
        if name in found:
            raise ValueError(f"field {shorten(name)} is given twice")
        found[name] = value
    return found


def _check_outcome(outcome: object) -> None:
    if not isinstance(outcome, dict) or str(outcome.get("status", "")).lower() not in (
            "succeeded", "failed"):
        raise InvalidInput("record needs outcome.status succeeded|failed")
    unknown = [name for name in outcome if name not in OUTCOME_FIELDS]
    if unknown:
        raise InvalidInput(f"unknown field {shorten('outcome.' + unknown[0])}; an outcome has "
                           f"{', '.join(OUTCOME_FIELDS)}")
    try:  # what payload takes, result takes: JSON every reader can read back
        canonical_payload(outcome.get("result"))
    except InvalidInput as exc:
        raise InvalidInput(f"outcome.result {str(exc).removeprefix('payload ')}") from None
