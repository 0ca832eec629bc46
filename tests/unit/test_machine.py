"""The state machine: table-driven checks plus a hypothesis stateful run against an oracle."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from effectlog.errors import Conflict, Fenced, IllegalTransition, PayloadMismatch
from effectlog.machine import LEGAL, advance, check, fold, new_effect
from effectlog.model import Approval, Decision, EffectEvent, Outcome, State, Transition

T, S = Transition, State

# The oracle, written from DESIGN.md's diagram independently of machine.LEGAL.
ORACLE = {
    "CREATED": {"RESERVE"},
    "RESERVED": {"CLAIM", "DISPATCH", "RECORD"},
    "DISPATCHED": {"CLAIM", "DISPATCH", "RECORD", "UNKNOWN"},
    "UNKNOWN": {"CLAIM", "DISPATCH", "RECORD", "AWAIT_APPROVAL", "APPROVE"},
    "AWAITING_APPROVAL": {"CLAIM", "RECORD", "APPROVE"},
    "SUCCEEDED": set(), "FAILED": set(), "ABANDONED": set(),
}
CLAIMS = {"RESERVE", "CLAIM", "APPROVE"}


def _dispatched(worker: str = "w1") -> EffectEvent:
    created = new_effect("op-1", "email.send", "mailto:a@example.com", {"s": 1}, worker)
    return advance(advance(created, T.RESERVE, worker), T.DISPATCH, worker)


def test_table_matches_the_design_diagram() -> None:
    for (before, transition), _ in LEGAL.items():
        if before is not None:
            assert transition.value in ORACLE[before.value]
    for before, names in ORACLE.items():
        for name in names:
            assert (State(before), Transition(name)) in LEGAL


def test_terminal_states_accept_nothing() -> None:
    done = advance(_dispatched(), T.RECORD, "w1", outcome=Outcome(S.SUCCEEDED, {}))
    for transition in Transition:
        with pytest.raises(Conflict):
            advance(done, transition, "w1")


def test_stale_epoch_is_rejected() -> None:
    event = _dispatched()
    claimed = advance(event, T.CLAIM, "w2")
    with pytest.raises(Fenced) as info:
        advance(claimed, T.RECORD, "w1", epoch=1, outcome=Outcome(S.SUCCEEDED, {}))
    assert info.value.reason == "stale_epoch"


def test_epoch_owned_by_another_worker_is_rejected() -> None:
    with pytest.raises(Fenced) as info:
        advance(_dispatched("w1"), T.UNKNOWN, "w2", error="x")
    assert info.value.reason == "foreign_owner"


def test_unclaimed_higher_epoch_is_rejected() -> None:
    with pytest.raises(Fenced) as info:
        advance(_dispatched(), T.UNKNOWN, "w1", epoch=5, error="x")
    assert info.value.reason == "unclaimed_epoch"


def test_claim_must_raise_the_epoch() -> None:
    with pytest.raises(Fenced):
        advance(_dispatched(), T.CLAIM, "w2", epoch=1)


def test_payload_mismatch_under_one_key_is_rejected() -> None:
    current = new_effect("op-1", "email.send", "t", {"s": 1}, "w1")
    other = new_effect("op-1", "email.send", "t", {"s": 2}, "w1")
    with pytest.raises(PayloadMismatch):
        check(current, other)


def test_key_that_does_not_match_its_fields_is_rejected() -> None:
    event = new_effect("op-1", "email.send", "t", {}, "w1")
    forged = replace(event.next(T.RESERVE, S.RESERVED, fencing_epoch=1),
                     idempotency_key="agent:op-1:email.send:u")
    with pytest.raises(PayloadMismatch):
        check(event, forged)


def test_duplicate_delivery_is_rejected() -> None:
    event = _dispatched()
    with pytest.raises(Conflict, match="duplicate"):
        check(event, event)


def test_unknown_transition_name_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        Transition.parse("teleport")
    assert Transition.parse(" dispatch ") is T.DISPATCH


def test_one_dispatch_per_claim_from_dispatched_or_unknown_a_claim_comes_first() -> None:
    dispatched = _dispatched()
    with pytest.raises(IllegalTransition, match="a second dispatch of epoch 1"):
        advance(dispatched, T.DISPATCH, "w1")
    unknown = advance(dispatched, T.UNKNOWN, "w1", error="timeout")
    with pytest.raises(IllegalTransition, match="needs a claim first"):
        advance(unknown, T.DISPATCH, "w1")
    for before in (dispatched, unknown):
        claimed = advance(before, T.CLAIM, "reconciler")
        again = advance(claimed, T.DISPATCH, "reconciler")
        assert again.fencing_epoch == 2 and again.attempt == 2


def test_approval_decides_the_next_state() -> None:
    unknown = advance(_dispatched(), T.UNKNOWN, "w1", error="timeout")
    retry = advance(unknown, T.APPROVE, "ops", approval=Approval(Decision.RETRY, "a", "b"))
    abandon = advance(unknown, T.APPROVE, "ops", approval=Approval(Decision.ABANDON, "a", "b"))
    assert (retry.state, abandon.state) == (S.RESERVED, S.ABANDONED)
    assert retry.fencing_epoch == unknown.fencing_epoch + 1


def test_record_needs_a_matching_outcome() -> None:
    event = _dispatched()
    with pytest.raises(IllegalTransition):
        check(event, event.next(T.RECORD, S.SUCCEEDED))


WORKERS = st.sampled_from(["w1", "w2", "w3"])
EPOCH_SHIFT = st.sampled_from([-1, 0, 0, 0, 1, 2])


class EffectMachine(RuleBasedStateMachine):
    """Random writers with random epochs; acceptance must match the oracle exactly."""

    @initialize(worker=WORKERS)
    def create(self, worker: str) -> None:
        self.current = new_effect("op-9", "payment.charge", "acct:7", {"amount": 5}, worker)
        self.log: list[EffectEvent] = [self.current]
        self.accepted: list[EffectEvent] = [self.current]

    def _offer(self, transition: Transition, state: State, worker: str, shift: int,
               **extra: object) -> None:
        cur = self.current
        epoch = cur.fencing_epoch + shift
        attempt = cur.attempt + (1 if transition is T.DISPATCH else 0)
        event = cur.next(transition, state, fencing_epoch=epoch, worker_id=worker,
                         attempt=attempt, **extra)
        legal = transition.value in ORACLE[cur.state.value]
        if transition is T.DISPATCH and cur.state is not S.RESERVED:
            legal = legal and cur.transition is T.CLAIM  # one DISPATCH per claim
        if transition.value in CLAIMS:
            fenced_ok = epoch > cur.fencing_epoch
        else:
            fenced_ok = epoch == cur.fencing_epoch and worker == cur.worker_id
        self.log.append(event)
        try:
            check(cur, event)
        except Conflict:
            assert not (legal and fenced_ok), f"refused a legal event {transition} from {cur.state}"
            return
        assert legal and fenced_ok, f"accepted {transition} from {cur.state} epoch {epoch}"
        self.current = event
        self.accepted.append(event)

    @rule(worker=WORKERS, shift=EPOCH_SHIFT)
    def reserve(self, worker: str, shift: int) -> None:
        self._offer(T.RESERVE, S.RESERVED, worker, shift)

    @rule(worker=WORKERS, shift=EPOCH_SHIFT)
    def claim(self, worker: str, shift: int) -> None:
        self._offer(T.CLAIM, self.current.state, worker, shift)

    @rule(worker=WORKERS, shift=EPOCH_SHIFT)
    def dispatch(self, worker: str, shift: int) -> None:
        self._offer(T.DISPATCH, S.DISPATCHED, worker, shift)

    @rule(worker=WORKERS, shift=EPOCH_SHIFT, ok=st.booleans())
    def record(self, worker: str, shift: int, ok: bool) -> None:
        state = S.SUCCEEDED if ok else S.FAILED
        self._offer(T.RECORD, state, worker, shift, outcome=Outcome(state, {"ok": ok}))

    @rule(worker=WORKERS, shift=EPOCH_SHIFT)
    def unknown(self, worker: str, shift: int) -> None:
        self._offer(T.UNKNOWN, S.UNKNOWN, worker, shift, error="timeout")

    @rule(worker=WORKERS, shift=EPOCH_SHIFT)
    def await_approval(self, worker: str, shift: int) -> None:
        self._offer(T.AWAIT_APPROVAL, S.AWAITING_APPROVAL, worker, shift)

    @rule(worker=WORKERS, shift=EPOCH_SHIFT, retry=st.booleans())
    def approve(self, worker: str, shift: int, retry: bool) -> None:
        decision = Decision.RETRY if retry else Decision.ABANDON
        state = S.RESERVED if retry else S.ABANDONED
        self._offer(T.APPROVE, state, worker, shift, approval=Approval(decision, "ops", "why"))

    @invariant()
    def epochs_never_go_back(self) -> None:
        epochs = [e.fencing_epoch for e in self.accepted]
        assert epochs == sorted(epochs)

    @invariant()
    def terminal_is_final(self) -> None:
        for event in self.accepted[:-1]:
            assert not event.state.terminal

    @invariant()
    def replaying_the_log_gives_the_same_state(self) -> None:
        current, rejected = fold(self.log)
        assert current == self.current
        assert len(rejected) == len(self.log) - len(self.accepted)

    @invariant()
    def one_dispatch_per_claim(self) -> None:
        """Between two accepted DISPATCHes the key was claimed again (a new epoch)."""
        dispatched_since_claim = False
        for event in self.accepted:
            if event.transition.value in CLAIMS:
                dispatched_since_claim = False
            elif event.transition is T.DISPATCH:
                assert not dispatched_since_claim, "two DISPATCHes under one claim"
                dispatched_since_claim = True

    @invariant()
    def attempts_count_dispatches(self) -> None:
        assert self.current.attempt == sum(e.transition is T.DISPATCH for e in self.accepted)


EffectMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=30, deadline=None)
TestEffectMachine = EffectMachine.TestCase


def test_event_ids_are_unique_and_a_forked_child_draws_its_own_prefix() -> None:
    import os

    from effectlog.model import new_event_id

    ids = {new_event_id() for _ in range(10_000)}
    assert len(ids) == 10_000 and all(len(i) == 32 for i in ids)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.write(write, new_event_id().encode())
        os._exit(0)
    os.waitpid(pid, 0)
    child = os.read(read, 64).decode()
    os.close(read)
    os.close(write)
    assert child[:16] != next(iter(ids))[:16] and child not in ids


@settings(max_examples=50)
@given(payload=st.dictionaries(st.text(max_size=8), st.integers() | st.text(max_size=8),
                               max_size=4),
       ref=st.none() | st.just("vault://payloads/1"))
def test_new_effect_is_a_legal_create(payload: dict[str, object], ref: str | None) -> None:
    event = new_effect("op-9", "email.send", "mailto:a@example.com", payload, "w1",
                       payload_ref=ref)
    check(None, event)  # new_effect skips this on the hot path: it must always pass
    assert (event.transition, event.state, event.fencing_epoch, event.attempt) == (
        T.CREATE, S.CREATED, 0, 0)


def test_an_epoch_above_the_maximum_is_illegal_so_no_claim_past_it_overflows() -> None:
    from effectlog.keys import MAX_FENCING_EPOCH

    reserved = advance(new_effect("op-1", "email.send", "t", {}, "w1"), T.RESERVE, "w1",
                       epoch=MAX_FENCING_EPOCH)
    with pytest.raises(IllegalTransition, match="above the highest one"):
        advance(reserved, T.CLAIM, "w2")
