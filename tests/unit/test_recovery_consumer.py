"""The recovery consumer: one command per stuck snapshot, durable across restarts, backoff."""

from __future__ import annotations

from pathlib import Path

import pytest

from consumers.bookkeeping import CommandLedger, consumer_db_path
from consumers.commands import ReconciliationCommand
from consumers.recovery import RecoveryConsumer, RecoverySettings
from effectlog.log import COMMANDS, EventLog, open_log
from effectlog.model import State, now_ms
from effectlog.worker import Worker
from tests.recovery_support import FoldReader, stuck

MIN = 60_000


class Clock:
    """Real time plus a test-controlled offset (the effects carry real timestamps)."""

    def __init__(self) -> None:
        self.offset = 0

    def __call__(self) -> int:
        return now_ms() + self.offset


@pytest.fixture
def log(tmp_path: Path) -> EventLog:
    return open_log(f"sqlite:///{tmp_path}/log.db")


@pytest.fixture
def worker(log: EventLog) -> Worker:
    return Worker(log, "w1")


@pytest.fixture
def clock() -> Clock:
    return Clock()


def consumer(log: EventLog, tmp_path: Path, clock: Clock, **settings: object) -> RecoveryConsumer:
    opts: dict[str, object] = {"stuck_after_s": 300, "command_timeout_s": 600,
                               "backoff_base_s": 60, "backoff_cap_s": 200}
    opts.update(settings)
    ledger = CommandLedger(consumer_db_path(tmp_path / "state", "recovery"))
    return RecoveryConsumer(log, FoldReader(log), ledger, RecoverySettings(**opts),  # type: ignore[arg-type]
                            clock=clock)


def commands(log: EventLog) -> list[ReconciliationCommand]:
    return [ReconciliationCommand.decode(r.value) for r in log.scan(COMMANDS, 0)]


def test_each_stuck_state_gets_one_command_keyed_by_idempotency_key(
        log: EventLog, worker: Worker, tmp_path: Path, clock: Clock) -> None:
    keys = {state: stuck(worker, f"op-{state.value.lower()}", state)
            for state in (State.CREATED, State.RESERVED, State.DISPATCHED, State.UNKNOWN)}
    clock.offset = 10 * MIN
    result = consumer(log, tmp_path, clock).run_once()
    issued = {c.idempotency_key: c for c in result.issued}
    assert set(issued) == {keys[State.RESERVED], keys[State.DISPATCHED], keys[State.UNKNOWN]}
    records = list(log.scan(COMMANDS, 0))
    assert {r.key for r in records} == set(issued)
    sent = {c.idempotency_key: c for c in commands(log)}
    dispatched = sent[keys[State.DISPATCHED]]
    assert dispatched.observed_state == "DISPATCHED" and dispatched.attempt == 1
    assert dispatched.observed_epoch == worker.get(keys[State.DISPATCHED]).fencing_epoch  # type: ignore[union-attr]


def test_entries_younger_than_the_deadline_are_left_alone(
        log: EventLog, worker: Worker, tmp_path: Path, clock: Clock) -> None:
    stuck(worker, "young", State.DISPATCHED)
    clock.offset = 4 * MIN
    assert consumer(log, tmp_path, clock).run_once().issued == []
    assert commands(log) == []


def test_no_second_command_while_one_is_outstanding(
        log: EventLog, worker: Worker, tmp_path: Path, clock: Clock) -> None:
    stuck(worker, "once", State.DISPATCHED)
    clock.offset = 10 * MIN
    recovery = consumer(log, tmp_path, clock)
    assert len(recovery.run_once().issued) == 1
    clock.offset += 5 * MIN
    again = recovery.run_once()
    assert again.issued == [] and again.outstanding == 1
    assert len(commands(log)) == 1


def test_no_second_command_after_a_restart_of_the_consumer(
        log: EventLog, worker: Worker, tmp_path: Path, clock: Clock) -> None:
    stuck(worker, "restart", State.UNKNOWN)
    clock.offset = 10 * MIN
    first = consumer(log, tmp_path, clock)
    assert len(first.run_once().issued) == 1
    first.ledger.close()
    restarted = consumer(log, tmp_path, clock)  # new process: only the ledger file survives
    assert restarted.run_once().issued == []
    assert len(commands(log)) == 1


def test_command_is_issued_again_after_the_command_timeout(
        log: EventLog, worker: Worker, tmp_path: Path, clock: Clock) -> None:
    key = stuck(worker, "timeout", State.DISPATCHED)
    clock.offset = 10 * MIN
    recovery = consumer(log, tmp_path, clock)
    recovery.run_once()
    clock.offset += 11 * MIN  # past command_timeout_s=600
    again = recovery.run_once().issued
    assert [(c.idempotency_key, c.attempt) for c in again] == [(key, 2)]


def test_a_changed_entry_is_no_longer_outstanding(
        log: EventLog, worker: Worker, tmp_path: Path, clock: Clock) -> None:
    key = stuck(worker, "changed", State.DISPATCHED)
    clock.offset = 10 * MIN
    recovery = consumer(log, tmp_path, clock)
    recovery.run_once()
    Worker(log, "w2").claim(key)  # someone claimed it: new epoch, still DISPATCHED
    clock.offset += 10 * MIN
    again = recovery.run_once().issued
    assert len(again) == 1 and again[0].observed_epoch == 2 and again[0].attempt == 1


def test_ambiguous_entries_back_off_exponentially_up_to_the_cap(
        log: EventLog, worker: Worker, tmp_path: Path, clock: Clock) -> None:
    key = stuck(worker, "doubt", State.UNKNOWN)
    recovery = consumer(log, tmp_path, clock, stuck_after_s=0, command_timeout_s=10,
                        backoff_base_s=60, backoff_cap_s=200)
    start = now_ms()
    clock.offset = 0
    assert len(recovery.run_once().issued) == 1          # attempt 1
    worker.await_approval(key, "lookup unavailable")      # reconciliation left it in doubt
    times = []
    for step_s in range(0, 1000, 5):
        clock.offset = step_s * 1000
        for c in recovery.run_once().issued:
            times.append(((c.issued_at - start) // 1000, c.attempt))
        if len(times) == 4:
            break
    waits = [b[0] - a[0] for a, b in zip([(0, 1), *times], times, strict=False)]
    assert [a for _, a in times] == [2, 3, 4, 5]
    # 60s, then 120s, then capped at 200s (the command timeout of 10s is shorter)
    assert [round(w, -1) for w in waits] == [60, 120, 200, 200]


def test_per_kind_deadline_overrides_the_default(
        log: EventLog, worker: Worker, tmp_path: Path, clock: Clock) -> None:
    email = stuck(worker, "mail", State.DISPATCHED)
    pay = stuck(worker, "pay", State.DISPATCHED, kind="payment.charge", target="acct-1")
    recovery = consumer(log, tmp_path, clock, per_kind={"payment.": 3600.0}, command_timeout_s=7200)
    clock.offset = 10 * MIN
    assert [c.idempotency_key for c in recovery.run_once().issued] == [email]
    clock.offset = 61 * MIN
    assert [c.idempotency_key for c in recovery.run_once().issued] == [pay]
    assert RecoverySettings(per_kind={"payment": 1.0, "payment.card": 2.0}).deadline_s(
        "payment.card.charge") == 2.0


def test_settled_entries_are_forgotten_by_the_ledger(
        log: EventLog, worker: Worker, tmp_path: Path, clock: Clock) -> None:
    key = stuck(worker, "settled", State.DISPATCHED)
    clock.offset = 10 * MIN
    recovery = consumer(log, tmp_path, clock)
    recovery.run_once()
    assert recovery.ledger.tracked() == [key]
    worker.record(key, State.SUCCEEDED, {"id": 1})
    recovery.run_once()
    assert recovery.ledger.tracked() == []


def test_payload_ref_travels_in_the_command(
        log: EventLog, worker: Worker, tmp_path: Path, clock: Clock) -> None:
    stuck(worker, "secret", State.RESERVED, payload_ref="vault://secret/1")
    clock.offset = 10 * MIN
    (command,) = consumer(log, tmp_path, clock).run_once().issued
    assert command.payload_ref == "vault://secret/1"
    assert commands(log)[0].payload_ref == "vault://secret/1"
