"""The recovery consumer: finds effects stuck past a deadline and asks for reconciliation.

Stuck entries come from the projection's state/time index (``scan_state``), never from a
full scan. One command per stuck snapshot: the ledger (fsync'd before the command is sent)
keeps a second one from being issued while the first is outstanding, across restarts too.
A command stops being outstanding when the entry's state, epoch or last transition changes,
after ``command_timeout_s``, or at once when the command is no longer in the log (the log
was lost and restored from an older copy: its commands topic ends before the command's
offset). Entries that stay ambiguous after reconciliation (UNKNOWN, AWAITING_APPROVAL) are
asked about again with capped exponential backoff. The ledger belongs to one log: a
consumer pointed at a log with another identity refuses to run (:class:`WrongLog`).
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from consumers.bookkeeping import CommandLedger, Issued
from consumers.commands import ReconciliationCommand
from effectlog.errors import BackendUnavailable, EffectlogError, InvalidInput, WrongLog
from effectlog.log.base import COMMANDS, EventLog
from effectlog.metrics import Metrics
from effectlog.model import EffectEvent, State, Transition, now_ms
from projections.store import Logged, ProjectionReader

logger = logging.getLogger(__name__)

AMBIGUOUS = frozenset({State.UNKNOWN, State.AWAITING_APPROVAL})
DEFAULT_STATES = (State.RESERVED, State.DISPATCHED, State.UNKNOWN, State.AWAITING_APPROVAL)


@dataclass(frozen=True, slots=True)
class RecoverySettings:
    """Deadlines and pacing of the recovery consumer (seconds unless named otherwise).

    ``per_kind`` maps a kind or kind prefix (``payment.``) to its own deadline; the longest
    matching prefix wins.
    """

    stuck_after_s: float = 300.0
    per_kind: Mapping[str, float] = field(default_factory=dict)
    command_timeout_s: float = 600.0
    backoff_base_s: float = 60.0
    backoff_cap_s: float = 3600.0
    states: tuple[State, ...] = DEFAULT_STATES
    max_commands: int = 1000
    poll_s: float = 5.0

    def __post_init__(self) -> None:
        values = [self.stuck_after_s, self.command_timeout_s, self.backoff_base_s,
                  self.backoff_cap_s, self.poll_s, *self.per_kind.values()]
        if any(not 0 <= v < math.inf for v in values) or self.max_commands < 1:
            raise InvalidInput("recovery settings must be finite and non-negative "
                               "(max_commands >= 1)")

    def deadline_s(self, kind: str) -> float:
        """How long an effect of ``kind`` may sit in one state before it counts as stuck."""
        matches = [p for p in self.per_kind if kind == p or kind.startswith(p)]
        return self.per_kind[max(matches, key=len)] if matches else self.stuck_after_s

    def backoff_s(self, attempts: int) -> float:
        """Wait after the ``attempts``-th command for an entry that stays ambiguous."""
        if attempts < 1:
            return 0.0
        return float(min(self.backoff_cap_s, self.backoff_base_s * 2 ** min(attempts - 1, 32)))

    @property
    def min_deadline_s(self) -> float:
        return min([self.stuck_after_s, *self.per_kind.values()])

    def deadlines_json(self) -> dict[str, Any]:
        """The deadlines a pass asked for by hand sends to ``POST /v1/recover``."""
        return {"stuck_after_s": self.stuck_after_s, "per_kind": dict(self.per_kind),
                "command_timeout_s": self.command_timeout_s, "max_commands": self.max_commands}

    def with_deadlines(self, body: Mapping[str, Any]) -> RecoverySettings:
        """These settings with the deadlines of :meth:`deadlines_json`'s shape
        (:class:`InvalidInput` for a bad one)."""
        try:
            per_kind = {str(k): float(v) for k, v in dict(body.get("per_kind") or {}).items()}
            return replace(self, stuck_after_s=float(body["stuck_after_s"]), per_kind=per_kind,
                           command_timeout_s=float(body.get("command_timeout_s",
                                                            self.command_timeout_s)),
                           max_commands=int(body.get("max_commands", self.max_commands)))
        except (KeyError, TypeError, ValueError, OverflowError) as exc:  # int(1e999)
            raise InvalidInput(f"bad recovery settings: {type(exc).__name__}: {exc}") from None


@dataclass(frozen=True, slots=True)
class PassResult:
    """What one recovery pass did."""

    issued: list[ReconciliationCommand]
    outstanding: int   # stuck entries skipped because a command is still outstanding
    backing_off: int   # ambiguous entries waiting out their backoff
    truncated: bool    # stopped at ``max_commands``


class RecoveryConsumer:
    """Reads the projection, writes reconciliation commands keyed by idempotency key."""

    def __init__(self, log: EventLog, reader: ProjectionReader, ledger: CommandLedger,
                 settings: RecoverySettings | None = None, *,
                 clock: Callable[[], int] = now_ms, metrics: Metrics | None = None) -> None:
        self.log = log
        self.reader = reader
        self.ledger = ledger
        self.settings = settings or RecoverySettings()
        self.clock = clock
        self.metrics = metrics
        self._bound = False
        self._pass = threading.Lock()  # one pass at a time on the ledger

    def run_once(self, settings: RecoverySettings | None = None) -> PassResult:
        """One pass over every watched state; returns the commands it issued. ``settings``
        replace the consumer's own for this pass (a pass asked for by hand)."""
        with self._pass:
            return self._run_once(settings or self.settings)

    def _run_once(self, settings: RecoverySettings) -> PassResult:
        if not self._bound:  # refuse a ledger kept for another log before writing anything
            self.ledger.bind(self.log)
            self._bound = True
        refresh = getattr(self.reader, "refresh", None)
        if callable(refresh):  # a RocksDB reader sees what the projector committed since
            refresh()
        now = self.clock()
        issued: list[ReconciliationCommand] = []
        seen: set[str] = set()
        outstanding = backing_off = 0
        truncated = False
        ends: dict[int, int] | None = None  # of the commands topic, read once if needed
        for logged_at, entry in self._stuck(now, settings):
            seen.add(entry.idempotency_key)
            prev = self.ledger.get(entry.idempotency_key)
            lost = False
            if prev is not None and prev.offset is not None:
                ends = self.log.end_offsets(COMMANDS) if ends is None else ends
                lost = prev.lost(ends)
                if lost:
                    logger.warning("command %s for %s is no longer in the log (offset %d, "
                                   "the log ends at %d): issuing it again", prev.command_id,
                                   entry.idempotency_key, prev.offset,
                                   ends.get(prev.partition or 0, 0))
            due, attempts = self._due(prev, entry, lost, settings)
            if now < due:
                if prev is not None and prev.same_snapshot(entry.state.value, entry.fencing_epoch,
                                                           entry.occurred_at) \
                        and now < prev.issued_at + settings.command_timeout_s * 1000:
                    outstanding += 1
                else:
                    backing_off += 1
                continue
            if len(issued) >= settings.max_commands:
                truncated = True
                break
            issued.append(self._issue(entry, logged_at, attempts, now))
        if not truncated:
            self._prune(seen, settings)
        if issued:
            logger.info("recovery issued %d reconciliation command(s)", len(issued))
        return PassResult(issued, outstanding, backing_off, truncated)

    def run(self, stop: threading.Event) -> None:
        """Pass after pass until ``stop`` is set; backend errors are logged and retried
        (:class:`WrongLog` is raised: the log is not the one the ledger was kept for)."""
        while not stop.is_set():
            try:
                self.run_once()
            except WrongLog:
                raise  # another log than the ledger's: retrying cannot help
            except EffectlogError as exc:
                logger.warning("recovery pass failed: %s", exc)
            stop.wait(self.settings.poll_s)

    # -- internals -----------------------------------------------------------------------

    def _stuck(self, now: int, settings: RecoverySettings) -> Iterator[Logged]:
        """Entries stuck past their deadline, measured on the log's own time of their last
        record (never on the clock of the worker that wrote it)."""
        cutoff = now - int(settings.min_deadline_s * 1000)
        for state in settings.states:
            for found in self.reader.scan_logged(state, older_than_ms=cutoff):
                deadline_ms = int(settings.deadline_s(found.event.kind) * 1000)
                if found.logged_at <= now - deadline_ms:
                    yield found

    @staticmethod
    def _due(prev: Issued | None, entry: EffectEvent, lost: bool,
             settings: RecoverySettings) -> tuple[int, int]:
        """(earliest time a command may be issued, its attempt number)."""
        if prev is None:
            return 0, 1
        if lost:  # never reached a reconciler: the same attempt again, now
            return 0, max(prev.attempts, 1)
        backoff_ms = int(settings.backoff_s(prev.attempts) * 1000)
        if prev.same_snapshot(entry.state.value, entry.fencing_epoch, entry.occurred_at):
            timeout_ms = int(settings.command_timeout_s * 1000)
            return prev.issued_at + max(timeout_ms, backoff_ms), prev.attempts + 1
        if entry.state in AMBIGUOUS and entry.transition is not Transition.APPROVE:
            return prev.issued_at + backoff_ms, prev.attempts + 1  # still in doubt: back off
        return 0, 1  # moved on (re-dispatched, approved): a fresh entry

    def _issue(self, entry: EffectEvent, logged_at: int, attempts: int,
               now: int) -> ReconciliationCommand:
        age_s = (now - logged_at) / 1000
        command = ReconciliationCommand.for_event(
            entry, attempts, f"{entry.state.value} for {age_s:.0f}s (attempt {attempts})", now)
        # Ledger first: a crash before the append delays the command, never doubles it.
        previous = self.ledger.get(entry.idempotency_key)
        issued = Issued(entry.idempotency_key, entry.state.value, entry.fencing_epoch,
                        entry.occurred_at, now, attempts, command.command_id)
        self.ledger.put(issued)
        try:
            position = self.log.append(COMMANDS, entry.idempotency_key, command.encode())
        except BackendUnavailable:
            # Known not sent (no delivery report): undo, so the next pass retries at once
            # instead of waiting out the command timeout. A duplicate would be harmless anyway.
            if previous is None:
                self.ledger.forget(entry.idempotency_key)
            else:
                self.ledger.put(previous)
            raise
        self.ledger.put(replace(issued, partition=position.partition, offset=position.offset))
        if self.metrics:
            self.metrics.commands_issued.inc()
        logger.debug("command %s for %s (%s)", command.command_id, entry.idempotency_key,
                     command.reason)
        return command

    def _prune(self, seen: set[str], settings: RecoverySettings) -> None:
        """Forget keys that left the watched states (settled or abandoned)."""
        for key in self.ledger.tracked():
            if key in seen:
                continue
            current = self.reader.get(key)
            if current is None or current.state not in settings.states:
                self.ledger.forget(key)
