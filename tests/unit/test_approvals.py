"""Approvals: who decided and why is on the log; the CLI's exit codes; the policy per kind."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from consumers.approvals import approve
from consumers.policy import ApprovalPolicy
from consumers.table import Action
from effectlog.errors import IllegalTransition, InvalidInput, NotFound
from effectlog.log import EventLog, open_log
from effectlog.model import Decision, State, Transition
from effectlog.worker import Worker
from tests.recovery_support import stuck


@pytest.fixture
def log(tmp_path: Path) -> EventLog:
    return open_log(f"sqlite:///{tmp_path}/log.db")


def cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "effectlog.cli.main", "--log", f"sqlite:///{tmp_path}/log.db",
           "--state", str(tmp_path / "state"), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def test_retry_decision_returns_the_effect_to_reserved_with_who_and_why(log: EventLog) -> None:
    key = stuck(Worker(log, "w1"), "a1", State.AWAITING_APPROVAL)
    event = approve(log, key, "retry", "alice", "provider support confirmed nothing was sent")
    assert event.state is State.RESERVED and event.fencing_epoch == 2
    assert event.approval is not None and event.approval.decision is Decision.RETRY
    assert (event.approval.by, event.worker_id) == ("alice", "approval:alice")
    last = Worker(log, "reader").history(key)[-1]
    assert last.transition is Transition.APPROVE and last.approval == event.approval


def test_a_retry_decision_asks_the_reconciler_at_once_and_it_sends_it(tmp_path: Path) -> None:
    """No recovery pass, no deadline: the decision's own command is enough for the
    reconciler to send the effect again with its key; an abandon asks for nothing."""
    from tests.recovery_support import Harness

    h = Harness(tmp_path, f"sqlite:///{tmp_path}/log.db")
    retried = stuck(h.worker, "a-now", State.AWAITING_APPROVAL)
    dropped = stuck(h.worker, "a-drop", State.AWAITING_APPROVAL)
    decided = approve(h.log, retried, "retry", "alice", "the outbox shows nothing sent")
    approve(h.log, dropped, "abandon", "alice", "customer cancelled")
    (handled,) = h.reconciler().run_once()  # no recovery pass ran: the decision's command
    assert (handled.key, handled.action, handled.state) == (retried, Action.DISPATCH,
                                                            State.SUCCEEDED)
    final = h.worker.get(retried)
    assert final is not None and final.outcome is not None
    assert final.outcome.source == "redispatch" and final.fencing_epoch == decided.fencing_epoch + 1
    assert h.provider.executions(retried) == 1 and h.provider.calls(dropped) == 0


def test_a_retry_decision_stands_when_the_reconciler_cannot_be_asked(
        log: EventLog, monkeypatch: pytest.MonkeyPatch) -> None:
    from effectlog.errors import BackendUnavailable
    from effectlog.log.base import COMMANDS

    key = stuck(Worker(log, "w1"), "a-lost", State.AWAITING_APPROVAL)
    real_append = log.append

    def commands_down(topic: str, k: str, value: bytes) -> object:
        if topic == COMMANDS:
            raise BackendUnavailable("commands topic unreachable")
        return real_append(topic, k, value)

    monkeypatch.setattr(log, "append", commands_down)
    event = approve(log, key, "retry", "alice", "checked")  # recovery takes it up later
    assert event.state is State.RESERVED
    assert log.end_offsets(COMMANDS) == {0: 0}


def test_abandon_decision_ends_an_unknown_effect(log: EventLog) -> None:
    key = stuck(Worker(log, "w1"), "a2", State.UNKNOWN)
    assert approve(log, key, Decision.ABANDON, "bob", "customer cancelled").state is State.ABANDONED


def test_only_effects_in_doubt_take_a_decision(log: EventLog) -> None:
    worker = Worker(log, "w1")
    with pytest.raises(NotFound):
        approve(log, "agent:nope:email.send:x", "retry", "a", "b")
    for state in (State.CREATED, State.RESERVED, State.DISPATCHED):
        key = stuck(worker, f"not-{state.value.lower()}", state)
        with pytest.raises(IllegalTransition):
            approve(log, key, "retry", "a", "b")
    key = stuck(worker, "bad-args", State.UNKNOWN)
    with pytest.raises(InvalidInput):
        approve(log, key, "maybe", "a", "b")
    with pytest.raises(InvalidInput):
        approve(log, key, "retry", " ", "b")


def test_cli_approve_shows_in_history_and_maps_exit_codes(tmp_path: Path) -> None:
    log = open_log(f"sqlite:///{tmp_path}/log.db")
    worker = Worker(log, "w1")
    doubt = stuck(worker, "c1", State.AWAITING_APPROVAL)
    busy = stuck(worker, "c2", State.DISPATCHED)
    seen = worker.get(doubt)
    assert seen is not None
    log.close()
    moved = cli(tmp_path, "approve", doubt, "--decision", "retry", "--by", "carol",
                "--reason", "ticket #42", "--epoch", str(seen.fencing_epoch - 1))
    assert moved.returncode == 3 and "moved on since the decision was made" in moved.stderr
    done = cli(tmp_path, "approve", doubt, "--decision", "retry", "--by", "carol",
               "--reason", "ticket #42", "--epoch", str(seen.fencing_epoch), "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["state"] == "RESERVED"
    history = cli(tmp_path, "history", doubt, "--json")
    approval = json.loads(history.stdout.splitlines()[-1])["event"]["approval"]
    assert (approval["by"], approval["reason"], approval["decision"]) == (
        "carol", "ticket #42", "RETRY")
    assert cli(tmp_path, "approve", "agent:none:email.send:x", "--decision", "retry", "--by",
               "a", "--reason", "b").returncode == 1
    not_in_doubt = cli(tmp_path, "approve", busy, "--decision", "abandon", "--by", "a",
                       "--reason", "b")
    assert not_in_doubt.returncode == 3 and "DISPATCHED" in not_in_doubt.stderr
    assert cli(tmp_path, "approve", busy, "--decision", "maybe", "--by", "a",
               "--reason", "b").returncode == 2
    assert cli(tmp_path, "approve", busy, "--decision", "retry").returncode == 2


def test_policy_never_auto_retries_payment_or_browser_by_default() -> None:
    policy = ApprovalPolicy(auto_retry=("email.", "payment.", "browser."))
    assert policy.allows_auto_retry("email.send", lookup_complete=True)
    assert not policy.allows_auto_retry("email.send", lookup_complete=False)
    assert not policy.allows_auto_retry("payment.charge", lookup_complete=True)
    assert not policy.allows_auto_retry("browser.click", lookup_complete=True)
    assert not ApprovalPolicy().allows_auto_retry("email.send", lookup_complete=True)
    opted = ApprovalPolicy(auto_retry=("payment.",), allow_risky=("payment.refund",))
    assert opted.allows_auto_retry("payment.refund", lookup_complete=True)
    assert not opted.allows_auto_retry("payment.charge", lookup_complete=True)
