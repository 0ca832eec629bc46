"""The recovery table, one test per row (and the edges around it), on the pure function."""

from __future__ import annotations

import pytest

from consumers.table import Action, Facts, decide, needs_lookup
from effectlog.model import State
from effectlog.provider import LookupStatus

S, L = State, LookupStatus


# -- the five rows of DESIGN.md's recovery table ---------------------------------------------

def test_reserved_without_dispatch_record_dispatches_with_the_original_key() -> None:
    verdict = decide(Facts(S.RESERVED, lookup=None))
    assert verdict.action is Action.DISPATCH
    assert "original key" in verdict.reason


def test_dispatched_confirmed_records_the_result_without_replaying() -> None:
    verdict = decide(Facts(S.DISPATCHED, L.CONFIRMED))
    assert verdict.action is Action.RECORD
    assert "not replayed" in verdict.reason


def test_dispatched_not_found_with_complete_lookup_is_retried() -> None:
    assert decide(Facts(S.DISPATCHED, L.NOT_FOUND, lookup_complete=True)).action is Action.DISPATCH


def test_dispatched_not_found_with_incomplete_lookup_becomes_unknown() -> None:
    verdict = decide(Facts(S.DISPATCHED, L.NOT_FOUND, lookup_complete=False))
    assert verdict.action is Action.MARK_UNKNOWN
    assert "not complete" in verdict.reason


def test_unknown_confirmed_is_reconciled_by_recording() -> None:
    assert decide(Facts(S.UNKNOWN, L.CONFIRMED)).action is Action.RECORD


def test_unknown_with_unavailable_lookup_stays_unknown_and_requires_approval() -> None:
    verdict = decide(Facts(S.UNKNOWN, L.UNAVAILABLE, lookup_complete=True))
    assert verdict.action is Action.AWAIT_APPROVAL
    assert "approve" in verdict.reason


def test_unknown_with_ambiguous_not_found_requires_approval() -> None:
    verdict = decide(Facts(S.UNKNOWN, L.NOT_FOUND, lookup_complete=False))
    assert verdict.action is Action.AWAIT_APPROVAL


# -- edges: policy, payload off the log, foreign results, waiting ----------------------------

def test_unknown_not_found_with_complete_lookup_is_provably_safe_to_retry() -> None:
    assert decide(Facts(S.UNKNOWN, L.NOT_FOUND, lookup_complete=True)).action is Action.DISPATCH


def test_ambiguous_unknown_is_retried_when_the_kind_policy_allows_it() -> None:
    facts = Facts(S.UNKNOWN, L.UNAVAILABLE, lookup_complete=True, auto_retry=True)
    assert decide(facts).action is Action.POLICY_RETRY


def test_policy_never_retries_without_complete_lookup() -> None:
    facts = Facts(S.UNKNOWN, L.UNAVAILABLE, lookup_complete=False, auto_retry=True)
    assert decide(facts).action is Action.AWAIT_APPROVAL


def test_dispatched_with_unavailable_lookup_becomes_unknown() -> None:
    assert decide(Facts(S.DISPATCHED, L.UNAVAILABLE, lookup_complete=True)).action \
        is Action.MARK_UNKNOWN


def test_reserved_with_payload_off_the_log_is_routed_to_a_worker() -> None:
    verdict = decide(Facts(S.RESERVED, None, payload_on_log=False))
    assert verdict.action is Action.ROUTE_TO_WORKER
    assert "payload_ref" in verdict.reason


def test_dispatched_retry_with_payload_off_the_log_becomes_unknown_and_says_why() -> None:
    verdict = decide(Facts(S.DISPATCHED, L.NOT_FOUND, lookup_complete=True, payload_on_log=False))
    assert verdict.action is Action.MARK_UNKNOWN
    assert "payload_ref" in verdict.reason


def test_confirmed_result_for_another_payload_is_not_recorded() -> None:
    verdict = decide(Facts(S.DISPATCHED, L.CONFIRMED, foreign_result=True))
    assert verdict.action is Action.MARK_UNKNOWN
    assert "another payload" in verdict.reason


def test_awaiting_approval_waits_unless_the_provider_confirms() -> None:
    assert decide(Facts(S.AWAITING_APPROVAL, L.UNAVAILABLE)).action is Action.WAIT
    assert decide(Facts(S.AWAITING_APPROVAL, L.CONFIRMED)).action is Action.RECORD


def test_the_reason_says_what_the_lookup_answered() -> None:
    complete = decide(Facts(S.AWAITING_APPROVAL, L.NOT_FOUND, lookup_complete=True))
    assert complete.action is Action.WAIT
    assert complete.reason.startswith("not found by a complete lookup: ")
    partial = decide(Facts(S.AWAITING_APPROVAL, L.NOT_FOUND, lookup_complete=False))
    assert partial.reason.startswith("not found, and the provider's lookup is not complete")


@pytest.mark.parametrize("state", [S.CREATED, S.SUCCEEDED, S.FAILED, S.ABANDONED])
def test_states_that_are_not_stuck_are_skipped(state: State) -> None:
    assert decide(Facts(state, L.CONFIRMED)).action is Action.SKIP


def test_lookup_is_needed_once_anything_may_have_been_dispatched() -> None:
    assert not needs_lookup(S.RESERVED, attempt=0)
    assert needs_lookup(S.RESERVED, attempt=1)  # an approved retry
    assert all(needs_lookup(s, 1) for s in (S.DISPATCHED, S.UNKNOWN, S.AWAITING_APPROVAL))


def test_unknown_payment_not_found_by_complete_lookup_still_needs_a_decision() -> None:
    verdict = decide(Facts(State.UNKNOWN, LookupStatus.NOT_FOUND, lookup_complete=True,
                           risky=True))
    assert verdict.action is Action.AWAIT_APPROVAL


def test_dispatched_payment_not_found_by_complete_lookup_follows_the_table() -> None:
    verdict = decide(Facts(State.DISPATCHED, LookupStatus.NOT_FOUND, lookup_complete=True,
                           risky=True))
    assert verdict.action is Action.DISPATCH
