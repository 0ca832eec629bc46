"""A key that moves on while recovery scans is judged by its new state and age, never by its
old entry's age paired with its new snapshot.

Recovery's scan walks the index family as it was when the scan began (a RocksDB iterator)
while serve's projector goes on applying records, and recovery does I/O between the keys it
yields (ledger writes, command appends). A key RESERVED for ten minutes whose live worker
dispatches it meanwhile was yielded as "DISPATCHED for ten minutes": recovery issued a command
for a DISPATCH a few milliseconds old, the reconciler's lookup (the worker's call still in
flight) found nothing, and the reconciler claimed the effect and called the provider a second
time. Each key is now yielded only where its current snapshot is indexed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import effectlog.log.sqlite as sqlite_log
from consumers.bookkeeping import CommandLedger, OffsetStore, consumer_db_path
from consumers.providers.fake import FakeProvider
from consumers.reconciler import Reconciler, ReconcilerSettings
from consumers.recovery import RecoveryConsumer, RecoverySettings
from effectlog.log import open_log
from effectlog.log.base import COMMANDS, EventLog
from effectlog.model import State
from effectlog.worker import Worker
from projections.projector import Projector
from projections.rocksdb.store import RocksProjectionStore

SETTINGS = RecoverySettings(stuck_after_s=60, command_timeout_s=60)


class FirstCommandHook:
    """The real log; ``hook`` runs once, just before recovery appends its first command
    (serve's projector applying records while recovery's pass does its I/O)."""

    def __init__(self, log: EventLog, hook: Callable[[], None] | None) -> None:
        self._log, self.hook = log, hook

    def append(self, topic: str, key: str, value: bytes) -> Any:
        if topic == COMMANDS and self.hook is not None:
            hook, self.hook = self.hook, None
            hook()
        return self._log.append(topic, key, value)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._log, name)


class Scene:
    """K1 reserved ten minutes ago by a worker that died; K2 reserved ten minutes ago by a
    worker that dispatches it while recovery's pass runs."""

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.log = open_log(f"sqlite:///{tmp_path}/log.db")
        crashed, self.live = Worker(self.log, "crashed"), Worker(self.log, "live")
        monkeypatch.setattr(sqlite_log, "time",
                            SimpleNamespace(time=lambda: time.time() - 600))
        self.k1 = crashed.create("op-1", "email.send", "mailto:a@example.com",
                                 {"n": 1}).idempotency_key
        crashed.reserve(self.k1)
        self.k2 = self.live.create("op-2", "email.send", "mailto:b@example.com",
                                   {"n": 2}).idempotency_key
        self.live.reserve(self.k2)
        monkeypatch.setattr(sqlite_log, "time", time)
        store = RocksProjectionStore(tmp_path / "state")
        self.projector = Projector(self.log, store)
        self.projector.run(once=True)
        self.reader = store.reader()
        assert self.reader.get(self.k2).state is State.RESERVED  # type: ignore[union-attr]
        self.hooked = FirstCommandHook(self.log, self.dispatch_k2_now)
        ledger = CommandLedger(consumer_db_path(tmp_path / "state", "recovery"))
        self.recovery = RecoveryConsumer(self.hooked, self.reader, ledger,  # type: ignore[arg-type]
                                         SETTINGS)

    def dispatch_k2_now(self) -> None:
        self.live.dispatch(self.k2)  # accepted, logged now
        self.projector.run(once=True)  # serve's projector applies it


def test_a_dispatch_applied_during_the_scan_is_not_taken_for_stuck(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    scene = Scene(tmp_path, monkeypatch)
    issued = {c.idempotency_key: c for c in scene.recovery.run_once().issued}
    assert scene.hooked.hook is None  # the dispatch came in the middle of the pass
    assert scene.k1 in issued
    assert scene.k2 not in issued, issued[scene.k2].summary()


def test_the_live_call_is_the_only_provider_call(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    scene = Scene(tmp_path, monkeypatch)
    provider = FakeProvider(tmp_path / "provider.db", lookup_complete=True)
    scene.recovery.run_once()
    # the reconciler handles the pass's commands while the live worker's call is in flight
    Reconciler(scene.log, provider, OffsetStore(tmp_path / "offsets.db"),
               ReconcilerSettings(worker_id="reconciler-1")).run_once()
    event = scene.live.get(scene.k2)
    assert event is not None and event.state is State.DISPATCHED and event.fencing_epoch == 1
    provider.execute(event.target, event.payload_hash, scene.k2, 1, {"n": 2})  # the live call
    assert provider.calls(scene.k2) == 1
    assert [e.worker_id for e in scene.live.history(scene.k2)] == ["live"] * 3


def test_a_key_that_moved_is_found_under_its_new_entry(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    scene = Scene(tmp_path, monkeypatch)
    scene.recovery.run_once()
    scanned = list(scene.reader.scan_logged(State.DISPATCHED))
    assert [logged.event.idempotency_key for logged in scanned] == [scene.k2]
    assert time.time() * 1000 - scanned[0].logged_at < 60_000  # its own, new age
