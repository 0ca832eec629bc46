"""The reconciler, and a person deciding, act on exactly the state they decided on.

Its claim (or a policy's RETRY) is written on the snapshot the recovery table's verdict was
taken on; a key that moved meanwhile (a worker dispatched, another reconciler acted, a
person approved a retry and a redelivered job took it) is skipped, never claimed over:
before, the claim was rebuilt on the newer state and the reconciler dispatched on a verdict
about an older one, a second provider call. A re-dispatch sends only bytes that hash to the
effect's payload hash, never those of a CREATE the rules rejected.

The provider here performs every call (no dedupe by key) and counts them; hooks pause a
caller the way a slow network reply does.
"""

from __future__ import annotations

import dataclasses
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from consumers.approvals import approve
from consumers.bookkeeping import CommandLedger, OffsetStore, consumer_db_path
from consumers.providers.fake import FakeProvider
from consumers.reconciler import Reconciler, ReconcilerSettings
from consumers.recovery import RecoveryConsumer, RecoverySettings
from consumers.table import Action
from effectlog.codec import event_codec
from effectlog.errors import IllegalTransition
from effectlog.log import open_log
from effectlog.log.base import EVENTS
from effectlog.machine import new_effect
from effectlog.model import State, now_ms
from effectlog.worker import Worker
from tests.recovery_support import FoldReader, stuck


class CountingProvider:
    """Wraps the fake (performing every call: dedupe=False, as an API that trusts the
    caller's one-call-per-key promise) and counts execute() calls per key. ``before_lookup``
    / ``after_execute`` hooks let a test pause a caller (a slow network reply)."""

    def __init__(self, path: Path, *, lookup_complete: bool = True, dedupe: bool = False) -> None:
        self.inner = FakeProvider(path, lookup_complete=lookup_complete, dedupe=dedupe)
        self.lookup_complete = lookup_complete
        self.retention_s = self.inner.retention_s
        self.calls: Counter[str] = Counter()
        self.epochs: list[int] = []
        self.lock = threading.Lock()
        self.on_lookup: Callable[[str], Any] | None = None   # returns a stale answer or None
        self.on_execute: Callable[[str, int], None] | None = None

    def execute(self, target: str, payload_hash: str, key: str, epoch: int, payload: Any) -> Any:
        with self.lock:
            self.calls[key] += 1
            self.epochs.append(epoch)
        result = self.inner.execute(target, payload_hash, key, epoch, payload)
        if self.on_execute is not None:
            hook, self.on_execute = self.on_execute, None
            hook(key, epoch)
        return result

    def lookup(self, key: str) -> Any:
        answer = self.inner.lookup(key)
        if self.on_lookup is not None:
            hook, self.on_lookup = self.on_lookup, None
            hook(key)  # the reply was in flight while this ran: the answer is from before
        return answer


def issue_commands(log: Any, tmp: Path, ahead_ms: int = 10 * 60_000, name: str = "recovery") -> list:
    ledger = CommandLedger(consumer_db_path(tmp / "state", name))
    try:
        rc = RecoveryConsumer(log, FoldReader(log), ledger,
                              RecoverySettings(stuck_after_s=60, command_timeout_s=60),
                              clock=lambda: now_ms() + ahead_ms)
        return rc.run_once().issued
    finally:
        ledger.close()


def reconciler(log: Any, provider: Any, tmp: Path, name: str) -> Reconciler:
    offsets = OffsetStore(consumer_db_path(tmp / f"state-{name}", "reconciler"))
    return Reconciler(log, provider, offsets, ReconcilerSettings(worker_id=f"reconciler:{name}"))






def test_worker_dispatch_between_reconciler_read_and_claim_gives_two_calls(tmp_path: Path) -> None:
    """RESERVED row. A worker (e.g. a non-Python worker through ``effectlog append``:
    reserve, work, dispatch) dispatches after the reconciler read RESERVED but before its
    claim. The reconciler's claim is rebuilt over DISPATCHED, and it dispatches again with no
    lookup at all (the decision was taken for RESERVED, attempt 0)."""
    log = open_log(f"sqlite:///{tmp_path}/log.db")
    provider = CountingProvider(tmp_path / "provider.db", lookup_complete=False)
    worker = Worker(log, "slow-worker")
    key = stuck(worker, "op-1", State.RESERVED)
    (command,) = issue_commands(log, tmp_path)
    rec = reconciler(log, provider, tmp_path, "a")

    original_payload = rec._payload

    def paused_here(current):  # the reconciler thread is descheduled between read and claim
        if worker.get(key).state is State.RESERVED:
            event = worker.dispatch(key)  # accepted: epoch 1, the worker may call
            provider.execute(event.target, event.payload_hash, key, event.fencing_epoch,
                             {"to": "mailto:a@example.com", "op": "op-1"})
        return original_payload(current)

    rec._payload = paused_here  # type: ignore[method-assign]
    handled = rec.handle(command)
    print(handled, [(e.transition.value, e.fencing_epoch, e.worker_id) for e in worker.history(key)])
    # DISPATCHED with an incomplete lookup must never be re-dispatched (recovery table row 3);
    # the reconciler should have skipped ("lost to a concurrent writer") instead.
    assert provider.calls[key] == 1, (
        f"provider called {provider.calls[key]} times for {key} (epochs {provider.epochs}); "
        f"reconciler: {handled.action.value}: {handled.reason}")


def test_two_reconcilers_on_one_command_both_dispatch(tmp_path: Path) -> None:
    """UNKNOWN + complete lookup row, handled by two reconcilers (the old and the new owner
    around a failover, or serve and `effectlog reconcile --once --server` by hand; the docs say
    "a command handled again after a failover is re-judged by the key's state and epoch, never
    performed twice"). B's lookup reply is slow; meanwhile A looks up, claims, dispatches and
    its call performs and then times out (-> UNKNOWN). B's NOT_FOUND predates A's call, yet B
    claims over A's UNKNOWN and dispatches again."""
    log = open_log(f"sqlite:///{tmp_path}/log.db")
    provider = CountingProvider(tmp_path / "provider.db", lookup_complete=True)
    worker = Worker(log, "crashed-worker")
    key = stuck(worker, "op-2", State.UNKNOWN)
    (command,) = issue_commands(log, tmp_path)
    a = reconciler(log, provider, tmp_path, "a")
    b = reconciler(log, provider, tmp_path, "b")

    def a_runs_meanwhile(_key: str) -> None:
        provider.inner.inject_timeout_after_accept(1)  # A's call lands, the reply is lost
        handled_a = a.handle(command)
        assert handled_a.state is State.UNKNOWN, handled_a

    provider.on_lookup = a_runs_meanwhile  # B's lookup is the first one made
    handled_b = b.handle(command)
    print(handled_b, [(e.transition.value, e.state.value, e.fencing_epoch, e.worker_id)
                      for e in worker.history(key)])
    assert provider.calls[key] == 1, (
        f"provider called {provider.calls[key]} times (epochs {provider.epochs}), performed "
        f"{provider.inner.executions(key)} times; B: {handled_b.action.value}: {handled_b.reason}")


def test_two_reconcilers_in_flight_call_overlaps(tmp_path: Path) -> None:
    """DISPATCHED + complete lookup, two reconcilers, threads: A's call is in flight (slow)
    when B, whose lookup said NOT_FOUND before A dispatched, claims and dispatches."""
    log = open_log(f"sqlite:///{tmp_path}/log.db")
    provider = CountingProvider(tmp_path / "provider.db", lookup_complete=True)
    worker = Worker(log, "crashed-worker")
    key = stuck(worker, "op-3", State.DISPATCHED)
    (command,) = issue_commands(log, tmp_path)
    a = reconciler(log, provider, tmp_path, "a")
    b = reconciler(log, provider, tmp_path, "b")
    a_in_flight = threading.Event()
    release_a = threading.Event()

    def a_call_hangs(_key: str, _epoch: int) -> None:
        a_in_flight.set()
        release_a.wait(10)

    def b_lookup_slow(_key: str) -> None:  # B asked before A dispatched; the reply is late
        provider.on_execute = a_call_hangs
        t.start()
        assert a_in_flight.wait(10)

    results = {}
    t = threading.Thread(target=lambda: results.setdefault("a", a.handle(command)), daemon=True)
    provider.on_lookup = b_lookup_slow
    try:
        results["b"] = b.handle(command)
    finally:
        release_a.set()
        t.join(10)
    print(results, [(e.transition.value, e.state.value, e.fencing_epoch, e.worker_id)
                    for e in worker.history(key)])
    assert provider.calls[key] == 1, (
        f"provider called {provider.calls[key]} times (epochs {provider.epochs}); "
        f"B: {results['b'].action.value}: {results['b'].reason}")
    assert results["b"].action is Action.SKIP


def test_approved_retry_redelivered_job_and_reconciler_both_call(tmp_path: Path) -> None:
    """Only the documented high-level paths: an UNKNOWN effect is approved RETRY (`approve`
    asks the reconciler at once with a command); the job is delivered again to a worker
    (`Worker.perform`, which may take over a RESERVED key); the reconciler's lookup reply
    (needed for RESERVED after a retry) is slow, the worker's provider call is in flight when
    the reconciler claims: the claim is rebuilt over the worker's DISPATCHED and the
    reconciler dispatches too."""
    from consumers.commands import ReconciliationCommand
    from effectlog.log.base import COMMANDS

    log = open_log(f"sqlite:///{tmp_path}/log.db")
    provider = CountingProvider(tmp_path / "provider.db", lookup_complete=True)
    crashed = Worker(log, "crashed-worker")
    payload = {"to": "mailto:a@example.com", "op": "op-4"}
    key = stuck(crashed, "op-4", State.UNKNOWN, payload=payload)
    approve(log, key, "retry", "alice", "provider support: nothing was sent")
    (record,) = log.read(COMMANDS, 0, 0, 10)
    command = ReconciliationCommand.decode(record.value)
    rec = reconciler(log, provider, tmp_path, "a")
    redelivered = Worker(log, "worker-2")
    in_flight, release = threading.Event(), threading.Event()
    results: dict = {}

    def call(c):  # the worker's provider call: lands, the reply takes a while
        out = provider.execute(c.event.target, c.payload_hash, c.key, c.fencing_epoch, c.payload)
        in_flight.set()
        release.wait(10)
        return out

    def job() -> None:
        try:
            results["worker"] = redelivered.perform("op-4", "email.send", "mailto:a@example.com",
                                                    payload, call)
        except Exception as exc:
            results["worker"] = exc

    t = threading.Thread(target=job, daemon=True)

    def slow_lookup(_key: str) -> None:
        t.start()
        assert in_flight.wait(10)

    provider.on_lookup = slow_lookup
    try:
        results["reconciler"] = rec.handle(command)
    finally:
        release.set()
        t.join(10)
    print(results, [(e.transition.value, e.state.value, e.fencing_epoch, e.worker_id)
                    for e in crashed.history(key)])
    assert provider.calls[key] == 1, (
        f"one RETRY decision, {provider.calls[key]} provider calls (epochs {provider.epochs}); "
        f"reconciler: {results['reconciler'].action.value}: {results['reconciler'].reason}")






def test_redispatch_uses_only_the_accepted_create(tmp_path: Path) -> None:
    log = open_log(f"sqlite:///{tmp_path}/log.db")
    provider = CountingProvider(tmp_path / "provider.db", lookup_complete=True)
    genuine = {"to": "mailto:a@example.com", "amount": 10}
    created = new_effect("op-5", "email.send", "mailto:a@example.com", genuine, "w")
    # another writer's (buggy or hostile) CREATE: the genuine hash, other bytes -> rejected
    forged = dataclasses.replace(created, event_id="forged-1",
                                 payload=b'{"amount":100000,"to":"mailto:evil@example.com"}')
    log.append(EVENTS, created.idempotency_key, event_codec().encode(forged.to_record()))
    worker = Worker(log, "crashed-worker")
    key = stuck(worker, "op-5", State.DISPATCHED, payload=genuine)  # its CREATE is accepted
    assert next(e.event_id for e in worker.history(key)) == "forged-1"
    issue_commands(log, tmp_path)
    seen = []
    inner = provider.inner.execute
    provider.inner.execute = lambda t, h, k, e, p: (seen.append(p), inner(t, h, k, e, p))[1]
    handled = reconciler(log, provider, tmp_path, "a").run_once()
    print(handled, seen)
    assert seen == [genuine], f"re-dispatched with {seen}, the effect's payload is {genuine}"


def test_a_decision_sent_twice_is_refused_once_the_effect_moved_on(tmp_path: Path) -> None:
    """A person's RETRY is about the state their page showed (the console's form carries
    its epoch; `approve --epoch`): the same form sent again after the first retry's call went
    in doubt again is refused, not a second retry."""
    log = open_log(f"sqlite:///{tmp_path}/log.db")
    provider = CountingProvider(tmp_path / "provider.db", lookup_complete=True)
    worker = Worker(log, "crashed-worker")
    key = stuck(worker, "pay-1", State.UNKNOWN, kind="payment.charge", target="acct:42")
    rec = reconciler(log, provider, tmp_path, "a")
    issue_commands(log, tmp_path)
    provider.inner.inject_lookup_outage(1)
    rec.run_once()  # lookup unavailable: AWAITING_APPROVAL
    shown = worker.get(key)
    assert shown is not None and shown.state is State.AWAITING_APPROVAL
    approve(log, key, "retry", "alice", "bank says no charge", seen_epoch=shown.fencing_epoch)
    provider.inner.inject_timeout_after_accept(1)  # the retry's call lands; its reply is lost
    rec.run_once()
    assert worker.get(key).state is State.UNKNOWN  # type: ignore[union-attr]
    before = len(worker.history(key))
    with pytest.raises(IllegalTransition, match="moved on since the decision was made"):
        approve(log, key, "retry", "alice", "bank says no charge",
                seen_epoch=shown.fencing_epoch)
    assert len(worker.history(key)) == before  # nothing written
    provider.inner.inject_lookup_outage(1)
    rec.run_once()
    assert provider.calls[key] == 1
