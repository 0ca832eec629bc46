"""Human (or scripted) decisions on effects left in doubt.

An effect in UNKNOWN or AWAITING_APPROVAL waits for a decision: RETRY puts it back to
RESERVED (the next reconciliation dispatches it with the original key), ABANDON ends it.
The APPROVE event carries who decided and why, so ``history`` shows both.
"""

from __future__ import annotations

import logging

from effectlog.errors import IllegalTransition, InvalidInput, NotFound
from effectlog.log.base import EventLog
from effectlog.model import Decision, EffectEvent, State
from effectlog.text import check_free_text
from effectlog.view import LogView, StateView
from effectlog.worker import Worker
from effectlog.worker.core import MAX_WORKER_ID

logger = logging.getLogger(__name__)

DECIDABLE = frozenset({State.UNKNOWN, State.AWAITING_APPROVAL})


def approve(log: EventLog, key: str, decision: Decision | str, by: str, reason: str, *,
            view: StateView | None = None) -> EffectEvent:
    """Append the decision on ``key`` as an APPROVE event written by ``approval:<by>``.

    Raises :class:`NotFound` for an unknown key, :class:`IllegalTransition` when the key is
    not UNKNOWN or AWAITING_APPROVAL, :class:`InvalidInput` for a bad decision or empty
    ``by``/``reason``.
    """
    try:
        choice = Decision(decision.upper()) if isinstance(decision, str) else decision
    except ValueError:
        raise InvalidInput(f"decision must be retry or abandon, not {decision!r}") from None
    if not by.strip() or not reason.strip():
        raise InvalidInput("an approval needs who decided (--by) and why (--reason)")
    check_free_text("--by", by, max_chars=MAX_WORKER_ID)
    check_free_text("--reason", reason)
    # one key, once: folding it from the log is fine on any backend (a tool, not a worker)
    worker = Worker(log, f"approval:{by.strip()}", view=view if view is not None else LogView(log))
    current = worker.get(key)
    if current is None:
        raise NotFound(f"no effect with key {key}")
    if current.state not in DECIDABLE:
        raise IllegalTransition(f"{key} is {current.state.value}: only UNKNOWN or "
                                "AWAITING_APPROVAL effects take a decision")
    event = worker.approve(key, choice, by.strip(), reason.strip())
    logger.info("%s: %s by %s (%s)", key, choice.value, by, reason)
    return event
