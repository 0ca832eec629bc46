"""Recovery's bookkeeping never outlives the log it describes: a reconciliation command that
was issued into a log which was then lost is issued again as soon as the real log is back,
not after the command timeout."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from consumers.bookkeeping import CommandLedger, consumer_db_path
from consumers.recovery import RecoveryConsumer, RecoverySettings
from effectlog.errors import WrongLog
from effectlog.log import COMMANDS, open_log
from effectlog.model import State, now_ms
from effectlog.worker import Worker
from projections import open_reader
from projections.projector import project
from tests.recovery_support import FoldReader, stuck

EFFECTLOG = Path(sys.executable).with_name("effectlog")
LATER_MS = 10 * 60_000  # past the stuck deadline, well inside the 10-minute command timeout
SETTINGS = RecoverySettings(stuck_after_s=60, command_timeout_s=600)


def recover_once(tmp: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(EFFECTLOG), "--log", f"sqlite:///{tmp}/log.db", "--state",
                           str(tmp / "state"), "recover", "--once", "--stuck-after", "0s"],
                          capture_output=True, text=True, timeout=60)


def test_the_ledger_keeps_where_each_command_went(tmp_path: Path) -> None:
    log = open_log(f"sqlite:///{tmp_path}/log.db")
    key = stuck(Worker(log, "w1"), "op-1", State.DISPATCHED)
    ledger = CommandLedger(tmp_path / "recovery.db")
    consumer = RecoveryConsumer(log, FoldReader(log), ledger, SETTINGS,
                                clock=lambda: now_ms() + LATER_MS)
    assert len(consumer.run_once().issued) == 1
    issued = ledger.get(key)
    assert issued is not None and (issued.partition, issued.offset) == (0, 0)
    assert log.end_offsets(COMMANDS) == {0: 1}


def test_a_command_lost_with_its_log_is_issued_again_at_once(tmp_path: Path) -> None:
    """The log is lost after the command went in; the copy brought back was taken before:
    the command is not in it, so the next pass issues it again (the timeout is 10 min)."""
    url = f"sqlite:///{tmp_path}/log.db"
    log = open_log(url)
    key = stuck(Worker(log, "w1"), "op-1", State.DISPATCHED)
    log.close()
    shutil.copy(tmp_path / "log.db", tmp_path / "backup.db")
    ledger = CommandLedger(tmp_path / "recovery.db")

    def one_pass() -> list[str]:
        current = open_log(url)
        try:
            consumer = RecoveryConsumer(current, FoldReader(current), ledger, SETTINGS,
                                        clock=lambda: now_ms() + LATER_MS)
            result = consumer.run_once()
            return [c.idempotency_key for c in result.issued] + ["outstanding"] * result.outstanding
        finally:
            current.close()

    assert one_pass() == [key]
    assert one_pass() == ["outstanding"]  # in the log: outstanding until the timeout
    (tmp_path / "log.db").unlink()  # lost ...
    shutil.copy(tmp_path / "backup.db", tmp_path / "log.db")  # ... and the real log is back
    assert one_pass() == [key]
    issued = ledger.get(key)
    assert issued is not None and issued.attempts == 1  # the same attempt, sent again


def test_through_the_cli_a_lost_log_is_refused_then_the_command_is_reissued(tmp_path: Path) -> None:
    log = open_log(f"sqlite:///{tmp_path}/log.db")
    key = stuck(Worker(log, "w1"), "op-1", State.DISPATCHED)
    project(log, tmp_path / "state")
    log.close()
    shutil.copy(tmp_path / "log.db", tmp_path / "backup.db")
    assert f"reconcile {key}" in recover_once(tmp_path).stdout
    (tmp_path / "log.db").unlink()
    gone = recover_once(tmp_path)
    assert gone.returncode == 4 and "was built from log" in gone.stderr
    assert not (tmp_path / "log.db").exists()  # nothing was created in its place
    shutil.copy(tmp_path / "backup.db", tmp_path / "log.db")
    back = recover_once(tmp_path)
    assert back.returncode == 0, back.stderr
    assert f"reconcile {key}" in back.stdout and "1 command(s) issued" in back.stdout


def test_a_consumer_pointed_at_another_log_issues_nothing(tmp_path: Path) -> None:
    first = open_log(f"sqlite:///{tmp_path}/a.db")
    stuck(Worker(first, "w1"), "op-1", State.DISPATCHED)
    project(first, tmp_path / "state")
    ledger = CommandLedger(consumer_db_path(tmp_path / "state", "recovery"))
    reader = open_reader(tmp_path / "state")
    RecoveryConsumer(first, reader, ledger, SETTINGS, clock=lambda: now_ms() + LATER_MS).run_once()
    other = open_log(f"sqlite:///{tmp_path}/b.db")
    consumer = RecoveryConsumer(other, reader, ledger, SETTINGS, clock=lambda: now_ms() + LATER_MS)
    with pytest.raises(WrongLog, match="was kept for log"):
        consumer.run_once()
    assert other.end_offsets(COMMANDS) == {0: 0}
