"""Helpers of the recovery and reconciler tests: a log-folding reader and stuck effects."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from consumers.bookkeeping import CommandLedger, OffsetStore, consumer_db_path
from consumers.policy import ApprovalPolicy
from consumers.providers.fake import FakeProvider
from consumers.reconciler import Handled, Reconciler, ReconcilerSettings
from consumers.recovery import RecoveryConsumer, RecoverySettings
from effectlog.errors import Conflict
from effectlog.judge.client import ClusterJudge
from effectlog.log import open_log
from effectlog.log.base import EVENTS, EventLog, Position
from effectlog.machine import check, fold
from effectlog.model import EffectEvent, State, now_ms
from effectlog.view import decode_events
from effectlog.worker import Worker
from projections.store import Logged, ProjectionReader, Rejection
from tests.judges import scribe


class FoldReader(ProjectionReader):
    """A ProjectionReader that folds the log on every call (tests only: O(log))."""

    def __init__(self, log: EventLog) -> None:
        self.log = log

    def _snapshots(self) -> list[EffectEvent]:
        keys: dict[str, None] = {}
        for partition in range(self.log.partitions(EVENTS)):
            for record in self.log.scan(EVENTS, partition):
                keys.setdefault(record.key)
        found = [fold(decode_events(self.log, key))[0] for key in keys]
        return [e for e in found if e is not None]

    def get(self, key: str) -> EffectEvent | None:
        return fold(decode_events(self.log, key))[0]

    def scan_logged(self, state: State, older_than_ms: int | None = None,
                    limit: int | None = None,
                    after: tuple[int, str] | None = None) -> Iterator[Logged]:
        hits = sorted((found for found in self._logged() if found.event.state is state and (
            older_than_ms is None or found.logged_at < older_than_ms) and (
            after is None or (max(found.logged_at, 0), found.event.idempotency_key) > after)),
            key=lambda found: (found.logged_at, found.event.idempotency_key))
        yield from hits[:limit] if limit is not None else hits

    def _logged(self) -> list[Logged]:
        """Each key's snapshot with the log time of the record that made it."""
        out: dict[str, Logged] = {}
        state: dict[str, EffectEvent | None] = {}
        for partition in range(self.log.partitions(EVENTS)):
            for record in self.log.scan(EVENTS, partition):
                events = decode_events(self.log, record.key, [record])
                if not events:
                    continue
                try:
                    check(state.get(record.key), events[0])
                except Conflict:
                    continue
                state[record.key] = events[0]
                out[record.key] = Logged(record.timestamp_ms, events[0])
        return list(out.values())

    def rejected(self, limit: int | None = None) -> Iterator[Rejection]:
        return iter(())

    def rejected_at(self, position: Position) -> Rejection | None:
        return None

    def next_offsets(self) -> dict[int, int]:
        return self.log.end_offsets(EVENTS)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for e in self._snapshots():
            out[f"state:{e.state.value}"] = out.get(f"state:{e.state.value}", 0) + 1
        return out


def stuck(worker: Worker, op: str, state: State, *, kind: str = "email.send",
          target: str = "mailto:a@example.com", payload: Any = None,
          payload_ref: str | None = None) -> str:
    """Drive a new effect into ``state`` as a worker that then crashed; returns its key."""
    body = {"to": target, "op": op} if payload is None else payload
    event = worker.create(op, kind, target, body, payload_ref=payload_ref)
    key = event.idempotency_key
    if state is State.CREATED:
        return key
    worker.reserve(key)
    if state is State.RESERVED:
        return key
    worker.dispatch(key)
    if state is State.DISPATCHED:
        return key
    worker.unknown(key, "timeout talking to the provider")
    if state is State.UNKNOWN:
        return key
    worker.await_approval(key, "lookup unavailable")
    assert state is State.AWAITING_APPROVAL
    return key


class Harness:
    """A crashed worker's log, a fake provider, recovery and a reconciler."""

    def __init__(self, tmp_path: Path, log_url: str, *, lookup_complete: bool = True,
                 policy: ApprovalPolicy | None = None, projection: bool = False,
                 server: str | None = None) -> None:
        """``server``: the judge of the reconciler's writes (a serve URL), on Kafka."""
        self.tmp = tmp_path
        self.log: EventLog = open_log(log_url)
        self.projection = projection  # True: recovery reads the real RocksDB projection
        self.worker = scribe(self.log, "crashed-worker")
        self.provider = FakeProvider(tmp_path / "provider.db", lookup_complete=lookup_complete)
        self.policy = policy or ApprovalPolicy()
        self.offset_ms = 0
        self.server = server

    def reconciler(self) -> Reconciler:
        offsets = OffsetStore(consumer_db_path(self.tmp / "state", "reconciler"))
        settings = ReconcilerSettings(worker_id="reconciler-1", policy=self.policy)
        judge = None if self.server is None else ClusterJudge(self.server)
        return Reconciler(self.log, self.provider, offsets, settings, judge=judge)

    def reader(self) -> ProjectionReader:
        """The projection (caught up first) or a log-folding stand-in."""
        if not self.projection:
            return FoldReader(self.log)
        from projections import open_reader
        from projections.projector import project

        project(self.log, self.tmp / "state")
        return open_reader(self.tmp / "state")

    def recover_and_reconcile(self) -> list[Handled]:
        """Let the deadline pass, issue commands, and handle them."""
        self.offset_ms += 10 * 60_000
        ledger = CommandLedger(consumer_db_path(self.tmp / "state", "recovery"))
        settings = RecoverySettings(stuck_after_s=60, command_timeout_s=60, backoff_base_s=1,
                                    backoff_cap_s=1)
        reader = self.reader()
        recovery = RecoveryConsumer(self.log, reader, ledger, settings,
                                    clock=lambda: now_ms() + self.offset_ms)
        recovery.run_once()
        ledger.close()
        reader.close()
        return self.reconciler().run_once()

    def crash_after_provider_call(self, key: str) -> Any:
        """The worker's provider call lands, then the worker dies before recording."""
        event = self.worker.get(key)
        assert event is not None
        return self.provider.execute(event.target, event.payload_hash, key, event.fencing_epoch,
                                     {"to": event.target, "op": event.operation_id})

    def transitions(self, key: str) -> list[tuple[str, str, int, str]]:
        return [(e.transition.value, e.state.value, e.fencing_epoch, e.worker_id)
                for e in self.worker.history(key)]


def stop_serve(proc: subprocess.Popen[bytes], err_file: Path) -> str:
    """SIGTERM a running ``effectlog serve`` (SIGKILL after 90 s) and return its stderr."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=90)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    return err_file.read_text()
