"""A demo-like workload for the console tests: effects finished, in flight and in doubt.

Written through the real worker API on a real log, as the demo's workers leave it after a
bad night: payments whose provider timed out (UNKNOWN), effects parked for approval, one
payload kept off the log (``payload_ref``), text that carries markup and control
characters, and an event refused by the projector (a stale worker).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from effectlog.codec import event_codec
from effectlog.log.base import EVENTS, EventLog
from effectlog.machine import advance
from effectlog.model import EffectEvent, Outcome, State
from effectlog.model import Transition as T
from effectlog.worker import Worker

PAYMENT = "agent:run-0042-3:payment.charge:stripe:cus_ACME42"
MARKUP = "agent:run-0043-1:email.send:mailto:<b>ops</b>@example.com"


@dataclass(frozen=True)
class Workload:
    """What the tests look for: the UNKNOWN payment, and the event its paused worker
    still holds (dispatched at the old epoch)."""

    payment: str
    paused: EffectEvent


def fill(log: EventLog) -> Workload:
    """Append the workload; returns the payment to decide on."""
    w = Worker(log, "worker-2")
    for i in range(12):
        key = w.create(f"run-0040-{i}", "email.send", f"mailto:user{i}@example.com",
                       {"subject": f"receipt {i}"}).idempotency_key
        w.reserve(key)
        w.dispatch(key)
        w.record(key, "succeeded", {"message_id": f"m-{i}"})
    for i, customer in enumerate(("cus_ACME42", "cus_BETA7", "cus_GAMMA3")):
        key = w.create(f"run-0042-{i + 3}", "payment.charge", f"stripe:{customer}",
                       {"amount_cents": 12900 + i, "currency": "EUR",
                        "invoice": f"INV-10{42 + i}"}).idempotency_key
        w.reserve(key)
        w.dispatch(key)
        w.unknown(key, "provider timed out after 30s: the charge may have happened")
    paused = w.get(PAYMENT)
    assert paused is not None and paused.state is State.UNKNOWN
    ref = w.create("run-0044-1", "payment.refund", "stripe:ch_9",
                   None, payload_ref="vault://refunds/77").idempotency_key
    w.reserve(ref)
    w.dispatch(ref)
    w.unknown(ref, "connection reset")
    for op, kind, target in (("run-0045-1", "browser.click", "https://bank.example/transfer"),
                             ("run-0045-2", "deploy.release", "prod:api@v2.3.1")):
        key = w.create(op, kind, target, {"step": op}).idempotency_key
        w.reserve(key)
        w.dispatch(key)
        w.unknown(key, "worker crashed mid-call")
        w.await_approval(key, "policy: payment*/browser*/deploy* need a person")
    key = w.create("run-0043-1", "email.send", "mailto:<b>ops</b>@example.com",
                   {"subject": "<script>alert(1)</script> \u202egnp.exe"}).idempotency_key
    w.reserve(key)
    w.dispatch(key)
    w.unknown(key, "crash \x1b[31mred\x1b[0m <img src=x onerror=alert(1)>")
    key = w.create("run-0046-1", "ticket.create", "jira:OPS", {"title": "disk"}).idempotency_key
    w.reserve(key)
    w.dispatch(key)
    w.create("run-0046-2", "ticket.create", "jira:OPS", {"title": "cpu"})
    return Workload(PAYMENT, paused)


def stale_record(log: EventLog, paused: EffectEvent) -> int:
    """The paused worker wakes up and records its old call at its old epoch (as a worker
    that never re-read the key would); the projector must refuse it. Returns the offset."""
    late = replace(advance(replace(paused, state=State.DISPATCHED), T.RECORD, paused.worker_id,
                           outcome=Outcome(State.SUCCEEDED, {"charge": "ch_late"})),
                   fencing_epoch=paused.fencing_epoch)
    return log.append(EVENTS, paused.idempotency_key, event_codec().encode(late.to_record())).offset
