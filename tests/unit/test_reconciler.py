"""End to end on SQLite with the fake provider: crashed worker -> recover -> reconcile.

Every recovery-table row is driven through the real recovery consumer and reconciler, and
each test asserts the resulting state, history and the number of real provider effects.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from consumers.bookkeeping import CommandLedger, consumer_db_path
from consumers.policy import ApprovalPolicy
from consumers.recovery import RecoveryConsumer, RecoverySettings
from consumers.table import Action
from effectlog.errors import Conflict
from effectlog.keys import payload_hash
from effectlog.model import Decision, State, Transition, now_ms
from effectlog.provider import FencedByProvider, ProviderTimeout
from effectlog.worker import Worker
from tests.recovery_support import FoldReader, Harness, stuck


@pytest.fixture
def h(tmp_path: Path) -> Harness:
    return Harness(tmp_path, f"sqlite:///{tmp_path}/log.db")


# -- the recovery table, row by row ----------------------------------------------------------

def test_reserved_is_dispatched_with_the_original_key_payload_and_a_new_epoch(h: Harness) -> None:
    key = stuck(h.worker, "row1", State.RESERVED)
    (handled,) = h.recover_and_reconcile()
    assert handled.action is Action.DISPATCH and handled.state is State.SUCCEEDED
    assert h.transitions(key)[2:] == [("CLAIM", "RESERVED", 2, "reconciler-1"),
                                      ("DISPATCH", "DISPATCHED", 2, "reconciler-1"),
                                      ("RECORD", "SUCCEEDED", 2, "reconciler-1")]
    assert h.provider.executions(key) == 1
    found = h.provider.lookup(key)
    assert found.payload_hash == payload_hash({"to": "mailto:a@example.com", "op": "row1"})
    assert found.outcome is not None and found.outcome.result["epoch"] == 2


def test_dispatched_with_confirmed_result_is_recorded_not_replayed(h: Harness) -> None:
    key = stuck(h.worker, "row2", State.DISPATCHED)
    original = h.crash_after_provider_call(key)
    (handled,) = h.recover_and_reconcile()
    assert handled.action is Action.RECORD
    final = h.worker.get(key)
    assert final is not None and final.state is State.SUCCEEDED
    assert final.outcome is not None and final.outcome.source == "lookup"
    assert final.outcome.result == original
    assert h.provider.executions(key) == 1 and h.provider.calls(key) == 1
    assert "DISPATCH" not in [t for t, *_ in h.transitions(key)[3:]]


def test_dispatched_not_found_with_complete_lookup_is_retried_once(h: Harness) -> None:
    key = stuck(h.worker, "row3a", State.DISPATCHED)  # crashed before the call landed
    (handled,) = h.recover_and_reconcile()
    assert handled.action is Action.DISPATCH and handled.state is State.SUCCEEDED
    assert h.provider.executions(key) == 1


def test_each_outcome_says_who_learned_it() -> None:
    """The reconciler's re-dispatch, its lookup and the worker's own call are told apart
    on the RECORD event, and named so wherever an outcome is shown."""
    from effectlog.model import recorded_by

    assert [recorded_by(s) for s in ("worker", "lookup", "redispatch", None, "other")] == [
        "worker", "reconciler: lookup", "reconciler: re-dispatch", "worker", "other"]


def test_a_redispatch_and_a_lookup_are_recorded_as_such(tmp_path: Path) -> None:
    h = Harness(tmp_path, f"sqlite:///{tmp_path}/log.db")
    sent = stuck(h.worker, "src-sent", State.RESERVED)
    failed = stuck(h.worker, "src-failed", State.RESERVED, payload={"_fake_fail": "bounced"})
    looked = stuck(h.worker, "src-looked", State.DISPATCHED)
    h.crash_after_provider_call(looked)
    own = stuck(h.worker, "src-own", State.DISPATCHED)
    h.worker.record(own, State.SUCCEEDED, {"id": "by-the-worker"})
    h.recover_and_reconcile()
    sources = {}
    for key in (sent, failed, looked, own):
        final = h.worker.get(key)
        assert final is not None and final.outcome is not None, key
        sources[key] = (final.state, final.outcome.source)
    assert sources == {sent: (State.SUCCEEDED, "redispatch"),
                       failed: (State.FAILED, "redispatch"),
                       looked: (State.SUCCEEDED, "lookup"), own: (State.SUCCEEDED, "worker")}


def test_dispatched_not_found_with_incomplete_lookup_becomes_unknown(tmp_path: Path) -> None:
    h = Harness(tmp_path, f"sqlite:///{tmp_path}/log.db", lookup_complete=False)
    key = stuck(h.worker, "row3b", State.DISPATCHED)
    (handled,) = h.recover_and_reconcile()
    assert handled.action is Action.MARK_UNKNOWN
    final = h.worker.get(key)
    assert final is not None and final.state is State.UNKNOWN
    assert final.error is not None and "not complete" in final.error
    assert h.provider.executions(key) == 0 and h.provider.calls(key) == 0


def test_unknown_with_confirmed_result_is_reconciled(h: Harness) -> None:
    key = stuck(h.worker, "row4", State.DISPATCHED)
    h.provider.inject_timeout_after_accept()
    with pytest.raises(ProviderTimeout):
        h.crash_after_provider_call(key)
    h.worker.unknown(key, "ProviderTimeout")
    (handled,) = h.recover_and_reconcile()
    assert handled.action is Action.RECORD and handled.state is State.SUCCEEDED
    assert h.provider.executions(key) == 1


def test_unknown_with_unavailable_lookup_stays_in_doubt_awaiting_approval(h: Harness) -> None:
    key = stuck(h.worker, "row5", State.UNKNOWN)
    h.provider.inject_lookup_outage(1)
    (handled,) = h.recover_and_reconcile()
    assert handled.action is Action.AWAIT_APPROVAL
    final = h.worker.get(key)
    assert final is not None and final.state is State.AWAITING_APPROVAL
    assert final.error is not None and "approve" in final.error
    assert h.provider.executions(key) == 0


# -- approvals, policy, payload refs, fencing, bookkeeping -----------------------------------

def test_approved_retry_is_dispatched_by_the_next_reconciliation(h: Harness) -> None:
    key = stuck(h.worker, "approved", State.AWAITING_APPROVAL)
    Worker(h.log, "approval:alice").approve(key, Decision.RETRY, "alice", "checked the outbox")
    (handled,) = h.recover_and_reconcile()
    assert handled.action is Action.DISPATCH and handled.state is State.SUCCEEDED
    assert h.provider.executions(key) == 1
    approve = next(e for e in h.worker.history(key) if e.transition is Transition.APPROVE)
    assert approve.approval is not None and approve.approval.by == "alice"


def test_policy_retries_an_ambiguous_email_but_never_a_payment(tmp_path: Path) -> None:
    h = Harness(tmp_path, f"sqlite:///{tmp_path}/log.db",
                policy=ApprovalPolicy(auto_retry=("email.", "payment.")))
    mail = stuck(h.worker, "p-mail", State.UNKNOWN)
    pay = stuck(h.worker, "p-pay", State.UNKNOWN, kind="payment.charge", target="acct-7")
    h.provider.inject_lookup_outage(2)
    actions = {x.key: x.action for x in h.recover_and_reconcile()}
    assert actions == {mail: Action.POLICY_RETRY, pay: Action.AWAIT_APPROVAL}
    approvals = [e.approval for e in h.worker.history(mail) if e.approval is not None]
    assert approvals and approvals[0].by == "policy"
    assert h.provider.executions(mail) == 1 and h.provider.executions(pay) == 0


def test_reserved_with_payload_ref_is_left_for_a_worker_and_says_so(h: Harness) -> None:
    key = stuck(h.worker, "secret", State.RESERVED, payload_ref="vault://payloads/1")
    (handled,) = h.recover_and_reconcile()
    assert handled.action is Action.ROUTE_TO_WORKER
    last = h.worker.get(key)
    assert last is not None and last.state is State.RESERVED
    assert last.error is not None and "payload_ref" in last.error
    assert h.provider.calls(key) == 0
    before = len(h.worker.history(key))
    h.offset_ms += 3600_000  # past the command timeout: asked again, nothing new appended
    h.recover_and_reconcile()
    assert len(h.worker.history(key)) == before


def test_stale_command_is_skipped_when_the_entry_moved_on(h: Harness) -> None:
    key = stuck(h.worker, "moved", State.DISPATCHED)
    h.offset_ms += 10 * 60_000
    ledger = CommandLedger(consumer_db_path(h.tmp / "state", "recovery"))
    RecoveryConsumer(h.log, FoldReader(h.log), ledger, RecoverySettings(stuck_after_s=60),
                     clock=lambda: now_ms() + h.offset_ms).run_once()
    h.worker.record(key, State.SUCCEEDED, {"late": True})  # the worker was only slow
    (handled,) = h.reconciler().run_once()
    assert handled.action is Action.SKIP and "stale" in handled.reason
    assert h.provider.calls(key) == 0


def test_consumed_offsets_survive_a_restart(h: Harness) -> None:
    stuck(h.worker, "offsets", State.RESERVED)
    assert len(h.recover_and_reconcile()) == 1
    assert h.reconciler().run_once() == []


def test_paused_pre_crash_worker_is_fenced_by_log_and_provider(h: Harness) -> None:
    key = stuck(h.worker, "zombie", State.RESERVED)
    h.recover_and_reconcile()
    with pytest.raises(Conflict):  # the log refuses it (stale epoch / already settled)
        h.worker.dispatch(key)
    with pytest.raises(FencedByProvider):
        h.provider.execute("mailto:a@example.com", payload_hash({"to": "mailto:a@example.com",
                                                                  "op": "zombie"}), key, 1,
                           {"to": "mailto:a@example.com", "op": "zombie"})
    assert h.provider.executions(key) == 1


def test_recovery_through_the_real_rocksdb_projection(tmp_path: Path) -> None:
    h = Harness(tmp_path, f"sqlite:///{tmp_path}/log.db", projection=True)
    reserved = stuck(h.worker, "proj-1", State.RESERVED)
    unknown = stuck(h.worker, "proj-2", State.UNKNOWN)
    h.provider.inject_lookup_outage(1)
    actions = {x.key: x.action for x in h.recover_and_reconcile()}
    assert actions == {reserved: Action.DISPATCH, unknown: Action.AWAIT_APPROVAL}
    assert h.provider.executions(reserved) == 1 and h.provider.executions(unknown) == 0


def test_a_pass_goes_on_past_a_partition_it_cannot_reach_and_names_it(h: Harness) -> None:
    """A partition whose commands cannot be read or judged now (its owner moving, the log
    away) is named; the other partitions' commands are handled in the same pass, and the
    unreached one's on a later pass, each once."""
    from consumers.commands import ReconciliationCommand
    from effectlog.errors import BackendUnavailable
    from effectlog.log.base import COMMANDS

    first, second = (stuck(h.worker, op, State.RESERVED) for op in ("reach-1", "reach-2"))
    for key in (first, second):
        current = h.worker.get(key)
        assert current is not None
        h.log.append(COMMANDS, key, ReconciliationCommand.for_event(current, 1, "test").encode())

    class Unreachable:
        """The log as a reconciler of two commands partitions sees it, partition 1 away."""

        def __init__(self) -> None:
            self.away = True

        def __getattr__(self, name: str) -> object:
            return getattr(h.log, name)

        def partitions(self, topic: str) -> int:
            return 2 if topic == COMMANDS else h.log.partitions(topic)

        def read(self, topic: str, partition: int, *args: object) -> object:
            if topic == COMMANDS and partition == 1:
                if self.away:
                    raise BackendUnavailable("partition 1: no leader")
                return []
            return h.log.read(topic, partition, *args)  # type: ignore[arg-type]

    log = Unreachable()
    reconciler = h.reconciler()
    reconciler.log = log  # type: ignore[assignment]
    judged = reconciler.worker.get

    def judge(key: str) -> object:
        if key == second and log.away:
            raise BackendUnavailable("the judge of partition 0 did not answer")
        return judged(key)

    reconciler.worker.get = judge  # type: ignore[method-assign]
    done = reconciler.run_pass()
    assert [(x.key, x.action) for x in done.handled] == [(first, Action.DISPATCH)]
    assert done.unreached == {0: "the judge of partition 0 did not answer",
                              1: "partition 1: no leader"}
    with pytest.raises(BackendUnavailable, match=r"partition\(s\) 0 \(the judge"):
        reconciler.run_once()
    log.away = False
    again = reconciler.run_pass()
    assert [(x.key, x.action) for x in again.handled] == [(second, Action.DISPATCH)]
    assert again.unreached == {}
    assert (h.provider.executions(first), h.provider.executions(second)) == (1, 1)
