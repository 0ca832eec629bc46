"""The recovery table as one pure function: last durable state + provider lookup -> action.

No I/O here: the reconciler gathers the facts (state, lookup answer, provider and policy
properties) and performs what :func:`decide` returns.

| last durable state | provider lookup    | action                                              |
| ------------------ | ------------------ | --------------------------------------------------- |
| RESERVED           | no dispatch record | dispatch with the original key                      |
| DISPATCHED         | confirmed result   | record the result, do not replay                    |
| DISPATCHED         | not found          | retry if lookup is complete, else UNKNOWN           |
| UNKNOWN            | confirmed result   | reconcile (record) and continue                     |
| UNKNOWN            | ambiguous/unavail. | keep UNKNOWN, require policy/approval               |
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from effectlog.model import State
from effectlog.provider import LookupStatus


class Action(StrEnum):
    """What the reconciler does for one stuck effect."""

    DISPATCH = "dispatch"            # claim, then dispatch with the original key and payload
    RECORD = "record"                # claim, then record the provider's confirmed outcome
    MARK_UNKNOWN = "mark_unknown"    # claim, then DISPATCHED -> UNKNOWN
    AWAIT_APPROVAL = "await_approval"  # claim, then UNKNOWN -> AWAITING_APPROVAL
    POLICY_RETRY = "policy_retry"    # approve RETRY by policy, then dispatch
    ROUTE_TO_WORKER = "route_to_worker"  # payload is off the log: a worker must dispatch
    WAIT = "wait"                    # nothing to append: still awaiting a decision
    SKIP = "skip"                    # nothing to do (terminal, created, or not stuck)


@dataclass(frozen=True, slots=True)
class Facts:
    """Everything :func:`decide` looks at, gathered by the reconciler."""

    state: State
    lookup: LookupStatus | None  # None: no lookup was made (RESERVED, first dispatch)
    lookup_complete: bool = False
    payload_on_log: bool = True
    auto_retry: bool = False      # the kind's policy allows retrying an ambiguous effect
    foreign_result: bool = False  # the provider's result belongs to another payload
    risky: bool = False           # payment/browser kind not opted in: a person decides


@dataclass(frozen=True, slots=True)
class Verdict:
    """The action and a one-line reason, written to the event's ``error`` where it applies."""

    action: Action
    reason: str


def needs_lookup(state: State, attempt: int) -> bool:
    """Whether the provider must be asked first: always once something was dispatched."""
    if state is State.RESERVED:
        return attempt > 0  # an approved retry: the earlier attempt may have landed
    return state in (State.DISPATCHED, State.UNKNOWN, State.AWAITING_APPROVAL)


def decide(facts: Facts) -> Verdict:
    """The recovery table. Pure: same facts, same verdict."""
    state, lookup = facts.state, facts.lookup
    if state in (State.CREATED, State.SUCCEEDED, State.FAILED, State.ABANDONED):
        return Verdict(Action.SKIP, f"{state.value} is not stuck")
    if lookup is LookupStatus.CONFIRMED and not facts.foreign_result:
        return Verdict(Action.RECORD, "provider confirmed the result: recorded, not replayed")
    if state is State.RESERVED:
        # nothing confirmed: dispatch (a foreign result makes the provider refuse, -> UNKNOWN)
        return _dispatch(facts, "no confirmed dispatch: dispatch with the original key")
    if lookup is LookupStatus.CONFIRMED:
        return _ambiguous(facts, "the provider holds a result for another payload under this key")
    proof = lookup is LookupStatus.NOT_FOUND and facts.lookup_complete
    if proof and state is State.UNKNOWN and facts.risky:
        return _parked(state, "not found by a complete lookup, but an UNKNOWN payment or "
                       "browser action is never re-dispatched without a decision")
    if proof and state in (State.DISPATCHED, State.UNKNOWN):
        return _dispatch(facts, "not found and the provider's lookup is complete: retried "
                         "with the original key")
    not_found = "not found by a complete lookup" if facts.lookup_complete else \
        "not found, and the provider's lookup is not complete"
    what = {LookupStatus.NOT_FOUND: not_found,
            LookupStatus.UNAVAILABLE: "provider lookup unavailable"}.get(
                lookup, "not found") if lookup else "not looked up"
    return _ambiguous(facts, what)


def _dispatch(facts: Facts, reason: str) -> Verdict:
    if facts.payload_on_log:
        return Verdict(Action.DISPATCH, reason)
    why = f"{reason}; but the payload is kept off the log (payload_ref): a worker holding it must " \
        "dispatch"
    if facts.state is State.RESERVED:
        return Verdict(Action.ROUTE_TO_WORKER, why)
    return _parked(facts.state, why)


def _ambiguous(facts: Facts, what: str) -> Verdict:
    if facts.state is State.DISPATCHED:  # first UNKNOWN; a policy may retry on the next pass
        return Verdict(Action.MARK_UNKNOWN, f"{what}: the effect may have happened")
    if facts.auto_retry and facts.lookup_complete and facts.payload_on_log:
        return Verdict(Action.POLICY_RETRY, f"{what}: the kind's policy allows a retry with "
                       "the original key")
    return _parked(facts.state, f"{what}: the effect may have happened")


def _parked(state: State, why: str) -> Verdict:
    """Keep an effect in doubt: DISPATCHED -> UNKNOWN -> AWAITING_APPROVAL, then wait."""
    if state is State.DISPATCHED:
        return Verdict(Action.MARK_UNKNOWN, why)
    if state is State.AWAITING_APPROVAL:
        return Verdict(Action.WAIT, f"{why}; still awaiting a decision")
    return Verdict(Action.AWAIT_APPROVAL, f"{why}; kept UNKNOWN until a policy or person decides "
                   "(effectlog approve KEY --decision retry|abandon)")
