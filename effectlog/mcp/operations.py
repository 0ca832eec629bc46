"""Where a tool call's operation id comes from: first that applies,

1. the client's idempotency key (SEP-3182 ``idempotencyKey`` in the raw ``tools/call`` params,
   or in their ``_meta``): a client that retries sends the same key;
2. the argument the tool's config names (``operation_id = "order_id"``);
3. the run's next number for the call's kind and target, as ``effectlog.run`` numbers calls:
   ``{run_id}.{n}``; the run id is the request's ``_meta["effectlog/runId"]``, else the
   proxy's ``--run-id``, else one made up when the proxy started.

A value that is not a valid operation id (1-128 of ``[A-Za-z0-9._-]``) is used through its
hash, so any client key maps to one stable operation id.

A run number is taken only when the effect is about to be written (:meth:`OperationIds.take`,
after the arguments and the upstream connection were checked), and given back when the log
refused before anything was sent, so a call that sent nothing does not shift the numbers a
restarted run with the same run id gives its calls.
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from effectlog.errors import InvalidInput
from effectlog.keys import validate_operation_id
from effectlog.mcp.config import ToolEffect

CLIENT_KEY = "idempotencyKey"
RUN_META = "effectlog/runId"
_VALID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


@dataclass(frozen=True, slots=True)
class Operation:
    """One call's operation id and where it came from (client, argument or run)."""

    operation_id: str
    source: str

    @property
    def repeatable(self) -> bool:
        """Whether the same call sent again meets this operation again: true for a client key
        or an argument, false for a run number (a repeat takes the run's next number)."""
        return self.source != "run"


@dataclass(frozen=True, slots=True)
class Numbered:
    """A call the run numbers, not numbered yet: its run id, kind and target."""

    run_id: str
    kind: str
    target: str


def client_key(params: Mapping[str, Any]) -> str | None:
    """The SEP-3182 idempotency key of a raw ``tools/call``, in params or in ``_meta``."""
    meta = params.get("_meta")
    for value in (params.get(CLIENT_KEY), meta.get(CLIENT_KEY) if isinstance(meta, dict) else None):
        if value is None:
            continue
        if not isinstance(value, str) or not value:
            raise InvalidInput(f"{CLIENT_KEY} must be a non-empty string")
        return value
    return None


def as_operation_id(value: str) -> str:
    """``value`` if it is a valid operation id, else ``h-`` and 40 hex digits of its sha256."""
    if _VALID.match(value):
        return value
    return "h-" + hashlib.sha256(value.encode("utf-8")).hexdigest()[:40]


class OperationIds:
    """Numbers the calls of each run per kind and target; shared by the proxy's sessions."""

    def __init__(self, run_id: str) -> None:
        self.run_id = checked_run_id(run_id)
        self._counts: dict[tuple[str, str, str], int] = {}
        self._lock = threading.Lock()

    def for_call(self, effect: ToolEffect, params: Mapping[str, Any], target: str) -> Operation:
        """The operation of one raw ``tools/call`` of ``effect``'s tool on ``target``,
        numbered at once when the run numbers it."""
        return self.take(self.resolve(effect, params, target))

    def resolve(self, effect: ToolEffect, params: Mapping[str, Any],
                target: str) -> Operation | Numbered:
        """Where the call's operation id comes from, checked, without taking a run number."""
        key = client_key(params)
        if key is not None:
            return Operation(as_operation_id(key), "client")
        arguments = params.get("arguments") or {}
        if effect.operation_id is not None and arguments.get(effect.operation_id) is not None:
            value = arguments[effect.operation_id]
            if isinstance(value, bool) or not isinstance(value, str | int):
                raise InvalidInput(f"argument {effect.operation_id!r} names the operation: it "
                                   "must be a string or an integer")
            return Operation(as_operation_id(str(value)), "argument")
        meta = params.get("_meta")
        run = meta.get(RUN_META) if isinstance(meta, dict) else None
        run_id = self.run_id if run is None else checked_run_id(run)
        return Numbered(run_id, effect.kind, target)

    def take(self, wanted: Operation | Numbered) -> Operation:
        """The operation: ``wanted`` itself, or the run's next number for it."""
        if isinstance(wanted, Operation):
            return wanted
        slot = (wanted.run_id, wanted.kind, wanted.target)
        with self._lock:
            n = self._counts.get(slot, 0) + 1
            self._counts[slot] = n
        return Operation(validate_operation_id(f"{wanted.run_id}.{n}"), "run")

    def give_back(self, wanted: Operation | Numbered, taken: Operation) -> None:
        """Return the number ``take`` gave ``wanted`` when no later call took one since, so
        the next call meets the same key (a key is never unsafe to meet again)."""
        if not isinstance(wanted, Numbered):
            return
        slot = (wanted.run_id, wanted.kind, wanted.target)
        with self._lock:
            n = self._counts.get(slot, 0)
            if n and taken.operation_id == f"{wanted.run_id}.{n}":
                self._counts[slot] = n - 1


def checked_run_id(run_id: Any) -> str:
    """A run id that numbers valid operation ids, or :class:`InvalidInput`."""
    if not isinstance(run_id, str) or not _VALID.match(f"{run_id}.1"):
        raise InvalidInput(f"invalid run id {run_id!r}: use [A-Za-z0-9._-], at most 120 "
                           "characters, starting with a letter or digit")
    return run_id
