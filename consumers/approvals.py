"""Human (or scripted) decisions on effects left in doubt.

An effect in UNKNOWN or AWAITING_APPROVAL waits for a decision: RETRY puts it back to
RESERVED and asks the reconciler at once (a reconciliation command for the decision), which
dispatches it with the original key; ABANDON ends it. The APPROVE event carries who decided
and why, so ``history`` shows both.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from consumers.commands import ReconciliationCommand
from effectlog.errors import BackendUnavailable, IllegalTransition, InvalidInput, NotFound
from effectlog.log.base import COMMANDS, EventLog
from effectlog.machine import advance
from effectlog.model import Approval, Decision, EffectEvent, State, Transition
from effectlog.text import check_free_text
from effectlog.worker import Worker
from effectlog.worker.core import MAX_WORKER_ID

if TYPE_CHECKING:
    from effectlog.judge.query import Judge

logger = logging.getLogger(__name__)

DECIDABLE = frozenset({State.UNKNOWN, State.AWAITING_APPROVAL})


def approve(log: EventLog, key: str, decision: Decision | str, by: str, reason: str, *,
            judge: Judge | None = None, seen_epoch: int | None = None) -> EffectEvent:
    """Append the decision on ``key`` as an APPROVE event written by ``approval:<by>``,
    judged as any write (by ``judge`` on a log without compare-and-append), on exactly the
    state read here: a key that moves before the decision is written refuses it.

    ``seen_epoch`` is the fencing epoch of the state the person decided on (the console's
    page, ``approve --epoch``): a key that moved on since (a first RETRY re-dispatched it,
    and it is in doubt again) refuses the decision, so a form sent twice, or by two people,
    never retries twice.

    Raises :class:`NotFound` for an unknown key, :class:`IllegalTransition` when the key is
    not UNKNOWN or AWAITING_APPROVAL or not at ``seen_epoch``, :class:`InvalidInput` for a
    bad decision or empty ``by``/``reason``.
    """
    try:
        choice = Decision(decision.upper()) if isinstance(decision, str) else decision
    except ValueError:
        raise InvalidInput(f"decision must be retry or abandon, not {decision!r}") from None
    if not by.strip() or not reason.strip():
        raise InvalidInput("an approval needs who decided (--by) and why (--reason)")
    check_free_text("--by", by, max_chars=MAX_WORKER_ID)
    check_free_text("--reason", reason)
    worker = Worker(log, f"approval:{by.strip()}", judge=judge)
    current = worker.get(key)
    if current is None:
        raise NotFound(f"no effect with key {key}")
    if current.state not in DECIDABLE:
        raise IllegalTransition(f"{key} is {current.state.value}: only UNKNOWN or "
                                "AWAITING_APPROVAL effects take a decision")
    if seen_epoch is not None and current.fencing_epoch != seen_epoch:
        raise IllegalTransition(f"{key} moved on since the decision was made: it is "
                                f"{current.state.value} at epoch {current.fencing_epoch}, the "
                                f"decision was about epoch {seen_epoch}; look at it again")
    event = worker.write(advance(current, Transition.APPROVE, worker.worker_id,
                                 approval=Approval(choice, by.strip(), reason.strip())))
    logger.info("%s: %s by %s (%s)", key, choice.value, by, reason)
    if choice is Decision.RETRY:
        ask_reconciler(log, event)
    return event


def ask_reconciler(log: EventLog, decided: EffectEvent) -> bool:
    """Ask the reconciler of the key's partition to send an approved retry now: a command
    for the decision's snapshot, rather than waiting until recovery finds the key past its
    deadline (which it still does if this command cannot be written: False then)."""
    by = decided.approval.by if decided.approval is not None else "a person"
    command = ReconciliationCommand.for_event(decided, 1, f"RETRY approved by {by}")
    try:
        log.append(COMMANDS, decided.idempotency_key, command.encode())
    except BackendUnavailable as exc:
        logger.warning("%s: the retry waits for recovery's deadline: cannot ask the "
                       "reconciler now: %s", decided.idempotency_key, exc)
        return False
    return True
