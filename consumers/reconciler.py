"""The reconciler: consumes reconciliation commands and settles effects by provider lookup.

For each command it re-reads the key's current state, skips it when the entry moved on
since the command was issued, asks the provider what it knows, and appends the action the
recovery table (:mod:`consumers.table`) names. It writes as a :class:`Worker` with its own
worker id and always claims a new fencing epoch before writing, so a paused pre-crash
worker is fenced off, and a re-dispatch carries the original key, payload and the new epoch.
The claim (or a policy's RETRY) is written on exactly the state the verdict was taken on:
a key that moved meanwhile (a worker dispatched, another reconciler acted, a person decided)
is skipped, never claimed over on a verdict about an older state.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from consumers.commands import ReconciliationCommand
from consumers.policy import ApprovalPolicy
from consumers.table import Action, Facts, Verdict, decide, needs_lookup
from effectlog.errors import (
    BackendUnavailable,
    CodecError,
    Conflict,
    EffectlogError,
    InvalidInput,
    WrongLog,
)
from effectlog.log.base import COMMANDS, EventLog
from effectlog.machine import advance, payload_hash_of_bytes
from effectlog.metrics import Metrics
from effectlog.model import (
    LOOKUP,
    REDISPATCH,
    Approval,
    Decision,
    EffectEvent,
    State,
    Transition,
)
from effectlog.provider import (
    LookupResult,
    LookupStatus,
    Provider,
    ProviderFailed,
)
from effectlog.worker import Worker, default_worker_id
from effectlog.worker.base import unknown_reason

if TYPE_CHECKING:
    from effectlog.judge.query import Judge

logger = logging.getLogger(__name__)


class CommandOffsets(Protocol):
    """Where the reconciler keeps its consumed offsets (a local
    :class:`~consumers.bookkeeping.OffsetStore`, or the consumer group's on Kafka)."""

    def bind(self, log: EventLog) -> None:
        """Refuse (:class:`~effectlog.errors.WrongLog`) offsets kept for another log."""
        ...

    def get(self, topic: str) -> dict[int, int]: ...

    def commit(self, topic: str, partition: int, next_offset: int) -> None: ...


@dataclass(frozen=True, slots=True)
class ReconcilerSettings:
    """Identity and pacing of a reconciler."""

    worker_id: str = field(default_factory=lambda: f"reconciler:{default_worker_id()}")
    policy: ApprovalPolicy = field(default_factory=ApprovalPolicy)
    poll_s: float = 1.0
    batch: int = 100


@dataclass(frozen=True, slots=True)
class Handled:
    """What the reconciler did about one key."""

    key: str
    action: Action
    reason: str
    state: State | None  # the key's state afterwards


@dataclass(frozen=True, slots=True)
class ReconcilePass:
    """What one pass did, and the commands partitions it could not finish, with why (the
    judge or the log did not answer for them); their commands are handled on the next."""

    handled: list[Handled]
    unreached: dict[int, str]


class Reconciler:
    """Settles stuck effects; one instance per process, offsets kept in ``offsets``."""

    def __init__(self, log: EventLog, provider: Provider, offsets: CommandOffsets,
                 settings: ReconcilerSettings | None = None, *, judge: Judge | None = None,
                 metrics: Metrics | None = None,
                 partitions: Callable[[], Iterable[int]] | None = None) -> None:
        self.log = log
        # Commands are keyed like events, so command partition N belongs to the process
        # that owns events partition N (``partitions`` lists those; default: all).
        self.partitions = partitions
        self.provider = provider
        self.offsets = offsets
        self.settings = settings or ReconcilerSettings()
        # every write judged: by ``judge`` (serve's own) where the log has no compare-and-append
        self.worker = Worker(log, self.settings.worker_id, judge=judge)
        self.metrics = metrics
        self._bound = False

    # -- consuming commands --------------------------------------------------------------

    def run_once(self, timeout: float = 0.0) -> list[Handled]:
        """Handle every command not consumed yet; the offset is committed after each.
        :class:`BackendUnavailable` when a partition's commands could not all be handled
        (after every other partition's were)."""
        done = self.run_pass(timeout)
        if done.unreached:
            raise BackendUnavailable(unreached_text(done.unreached))
        return done.handled

    def run_pass(self, timeout: float = 0.0) -> ReconcilePass:
        """:meth:`run_once`, going on past a partition whose judge or log does not answer
        (a command there stays unconsumed) and saying which partitions those were."""
        if not self._bound:  # offsets kept for another (or a longer) log: refuse
            self.offsets.bind(self.log)
            self._bound = True
        done: list[Handled] = []
        unreached: dict[int, str] = {}
        stored = self.offsets.get(COMMANDS)
        mine = range(self.log.partitions(COMMANDS)) if self.partitions is None \
            else self.partitions()
        for partition in mine:
            try:
                self._consume(partition, stored.get(partition, 0), timeout, done)
            except WrongLog:
                raise
            except BackendUnavailable as exc:
                unreached[partition] = str(exc)
        return ReconcilePass(done, unreached)

    def _consume(self, partition: int, offset: int, timeout: float,
                 done: list[Handled]) -> None:
        while True:
            records = self.log.read(COMMANDS, partition, offset, self.settings.batch, timeout)
            if not records:
                return
            for record in records:
                try:
                    command = ReconciliationCommand.decode(record.value)
                except CodecError as exc:
                    logger.warning("skipping undecodable command at %s: %s", record.position, exc)
                else:
                    done.append(self.handle(command))
                offset = record.offset + 1
                self.offsets.commit(COMMANDS, partition, offset)

    def run(self, stop: threading.Event) -> None:
        """Consume until ``stop`` is set; backend errors are logged and retried."""
        while not stop.is_set():
            try:
                done = self.run_pass()
            except WrongLog:
                raise  # offsets kept for another log: retrying cannot help
            except EffectlogError as exc:
                logger.warning("reconciler pass failed: %s", exc)
                done = ReconcilePass([], {})
            if done.unreached:
                logger.warning("reconciler pass: %s", unreached_text(done.unreached))
            if not done.handled:
                stop.wait(self.settings.poll_s)

    def handle(self, command: ReconciliationCommand) -> Handled:
        """Act on one command unless its entry moved on since it was issued."""
        key = command.idempotency_key
        current = self.worker.get(key)
        if current is None:
            return self._done(Handled(key, Action.SKIP, "no such effect", None))
        if not command.matches(current):
            return self._done(Handled(key, Action.SKIP, "stale command: the effect moved on",
                                      current.state))
        return self.reconcile(current)

    # -- settling one effect -------------------------------------------------------------

    def reconcile(self, current: EffectEvent) -> Handled:
        """Look the key up (when the table needs it), decide, and append the outcome."""
        key = current.idempotency_key
        lookup = self._lookup(key) if needs_lookup(current.state, current.attempt) else None
        on_log, payload = self._payload(current)
        verdict = decide(Facts(
            state=current.state, lookup=lookup.status if lookup else None,
            lookup_complete=bool(self.provider.lookup_complete),
            payload_on_log=on_log,
            auto_retry=self.settings.policy.allows_auto_retry(current.kind,
                                                              bool(self.provider.lookup_complete)),
            foreign_result=bool(lookup and lookup.payload_hash
                                and lookup.payload_hash != current.payload_hash),
            risky=self.settings.policy.risky(current.kind),
        ))
        logger.info("reconcile %s: %s -> %s (%s)", key, current.state.value,
                    verdict.action.value, verdict.reason)
        try:
            state = self._perform(current, verdict, lookup, payload)
        except Conflict as exc:
            logger.warning("reconcile %s lost to a concurrent writer: %s", key, exc)
            latest = self.worker.get(key)
            return self._done(Handled(key, Action.SKIP, f"lost to a concurrent writer: {exc}",
                                      latest.state if latest else None))
        return self._done(Handled(key, verdict.action, verdict.reason, state))

    def _perform(self, current: EffectEvent, verdict: Verdict, lookup: LookupResult | None,
                 payload: Any) -> State:
        key, w, action = current.idempotency_key, self.worker, verdict.action
        if action in (Action.SKIP, Action.WAIT):
            return current.state
        if action is Action.ROUTE_TO_WORKER:
            return self._route_to_worker(current, verdict.reason)
        if action is Action.POLICY_RETRY:
            policy = self.settings.policy
            w.write(advance(current, Transition.APPROVE, w.worker_id, approval=Approval(
                Decision.RETRY, policy.actor, policy.reason(current.kind))))
            return self._dispatch(key, payload)
        # a new epoch before writing anything fences out the previous owner; written on the
        # state decided on (refused as a Conflict once the key moved: SKIP)
        transition = Transition.RESERVE if current.state is State.CREATED else Transition.CLAIM
        w.write(advance(current, transition, w.worker_id))
        if action is Action.RECORD:
            assert lookup is not None and lookup.outcome is not None
            outcome = lookup.outcome
            if self.metrics and outcome.status is State.SUCCEEDED:
                self.metrics.confirmed.inc()
            return self._record(key, outcome.status, outcome.result, LOOKUP)
        if action is Action.DISPATCH:
            return self._dispatch(key, payload)
        if action is Action.MARK_UNKNOWN:
            return w.unknown(key, verdict.reason).state
        if action is Action.AWAIT_APPROVAL:
            return w.await_approval(key, verdict.reason).state
        raise AssertionError(f"unhandled action {action}")

    def _dispatch(self, key: str, payload: Any) -> State:
        """Dispatch with the original key and payload under the epoch just claimed."""
        event = self.worker.dispatch(key)
        if self.metrics:
            self.metrics.attempts.inc()
        try:
            result = self.provider.execute(event.target, event.payload_hash, key,
                                           event.fencing_epoch, payload)
        except ProviderFailed as exc:
            failure = exc.result if exc.result is not None else {"error": str(exc)}
            return self._record(key, State.FAILED, failure, REDISPATCH)
        except Exception as exc:  # an outage, or an adapter's bug: the call may have happened
            return self.worker.unknown(key, f"re-dispatch: {unknown_reason(exc)}"[:500]).state
        if self.metrics:
            self.metrics.confirmed.inc()
        return self._record(key, State.SUCCEEDED, result, REDISPATCH)

    def _record(self, key: str, status: State, result: Any, source: str) -> State:
        """Record the outcome a re-dispatch or a lookup (``source``) answered; one that
        cannot be recorded (an adapter answering what is not JSON) leaves the effect UNKNOWN
        with the reason, as a worker's would, rather than stopping the reconciler with the
        effect DISPATCHED."""
        try:
            return self.worker.record(key, status, result, source=source).state
        except (TypeError, ValueError, InvalidInput) as exc:
            answer = "re-dispatch" if source == REDISPATCH else source
            reason = f"{answer} answered {status.value} with a result that cannot be " \
                     f"recorded: {unknown_reason(exc)}"
            return self.worker.unknown(key, reason[:500]).state

    def _route_to_worker(self, current: EffectEvent, reason: str) -> State:
        """Claim the key with the reason in the event's error, once: a worker holding the
        payload reserves (claims) it again and dispatches."""
        if current.transition is Transition.CLAIM and current.error == reason \
                and current.worker_id == self.worker.worker_id:
            return current.state
        event = advance(current, Transition.CLAIM, self.worker.worker_id, error=reason)
        return self.worker.write(event).state

    def _lookup(self, key: str) -> LookupResult:
        try:
            return self.provider.lookup(key)
        except Exception as exc:  # an adapter's bug or outage is "unavailable", not fatal
            logger.warning("lookup of %s failed: %s", key, exc)
            return LookupResult(LookupStatus.UNAVAILABLE, detail=f"{type(exc).__name__}: {exc}")

    def _payload(self, current: EffectEvent) -> tuple[bool, Any]:
        """(found, payload): the original payload from the CREATE event, unless it is
        kept off the log (payload_ref). Only bytes that hash to the effect's payload hash are
        taken: a CREATE the rules rejected for bytes that do not match it is not the
        effect's payload."""
        if current.payload_ref is not None:
            return False, None
        for event in self.worker.history(current.idempotency_key):
            if event.transition is Transition.CREATE and event.payload is not None \
                    and event.payload_hash == current.payload_hash \
                    and payload_hash_of_bytes(event.payload) == current.payload_hash:
                return True, json.loads(event.payload.decode("utf-8"))
        return False, None

    def _done(self, handled: Handled) -> Handled:
        if self.metrics:
            self.metrics.reconciliations.labels(action=handled.action.value).inc()
        return handled


def unreached_text(unreached: dict[int, str]) -> str:
    """One line: which commands partitions a pass did not finish, and why."""
    parts = ", ".join(f"{p} ({why})" for p, why in sorted(unreached.items()))
    return f"commands of partition(s) {parts} not handled; they are handled on the next pass"
