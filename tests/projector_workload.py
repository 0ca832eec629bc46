"""A deterministic event workload for projector tests: normal lifecycles, takeovers by a
second worker, and every kind of event the projector must reject.

Valid events come from :func:`effectlog.machine.new_effect` / :func:`advance`; the bulk is
then cloned at the record level (cheap) so that tens of thousands of events build in about
a second.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import replace

from effectlog.codec import event_codec
from effectlog.log.base import EVENTS, EventLog
from effectlog.machine import advance, new_effect
from effectlog.model import EffectEvent, Outcome, State
from effectlog.model import Transition as T

Item = tuple[str, bytes]


def lifecycle(i: int, tag: str = "w") -> list[EffectEvent]:
    """create -> reserve (w1) -> dispatch -> record: four accepted events."""
    create = new_effect(f"{tag}op{i}", "email.send", f"mailto:u{i}@example.com", {"n": i}, "w1")
    reserve = advance(create, T.RESERVE, "w1")
    dispatch = advance(reserve, T.DISPATCH, "w1")
    record = advance(dispatch, T.RECORD, "w1", outcome=Outcome(State.SUCCEEDED, {"id": i}))
    return [create, reserve, dispatch, record]


def rejected_samples(i: int) -> list[tuple[EffectEvent | bytes, str | None]]:
    """One effect's events with each bad event labelled by its expected rejection reason."""
    create = new_effect(f"bad{i}", "payment.charge", f"acct-{i}", {"amount": i}, "w1")
    reserve = advance(create, T.RESERVE, "w1")
    claim = advance(reserve, T.CLAIM, "w2")  # w2 takes over with epoch 2
    return [
        (create, None), (reserve, None), (claim, None),
        (replace(advance(reserve, T.DISPATCH, "w1"), event_id=f"stale{i}"), "stale_epoch"),
        (replace(advance(claim, T.DISPATCH, "w2"), worker_id="w3",
                 event_id=f"foreign{i}"), "foreign_owner"),
        (replace(advance(claim, T.DISPATCH, "w2"), fencing_epoch=7,
                 event_id=f"unclaimed{i}"), "unclaimed_epoch"),
        (replace(advance(claim, T.DISPATCH, "w2"), payload_hash="0" * 64,
                 event_id=f"mismatch{i}"), "payload_mismatch"),
        (claim, "duplicate"),
        (replace(advance(claim, T.DISPATCH, "w2"), transition=T.CREATE, state=State.CREATED,
                 event_id=f"illegal{i}"), "illegal_transition"),
        (b"\xc3\x01not avro at all", "undecodable"),
    ]


def build(effects: int, seed: int = 7, bad_every: int = 50) -> tuple[list[Item], Counter[str]]:
    """About ``4 * effects`` events; every ``bad_every``-th effect adds the rejected samples.

    Returns the (key, bytes) items in log order and the expected rejection counts.
    """
    codec = event_codec()
    rng = random.Random(seed)
    template = [e.to_record() for e in lifecycle(0)]
    expected: Counter[str] = Counter()
    streams: list[list[Item]] = []
    for i in range(effects):
        key = f"agent:op{i}:email.send:mailto:u{i}@example.com"
        recs = []
        for step, base in enumerate(template):
            rec = dict(base)
            rec.update(idempotency_key=key, operation_id=f"op{i}", target=f"mailto:u{i}@example.com",
                       event_id=f"e{i}-{step}")
            recs.append(codec.encode(rec))
        streams.append([(key, raw) for raw in recs])
        if i % bad_every == 0:
            bad: list[Item] = []
            for event, reason in rejected_samples(i):
                if isinstance(event, bytes):
                    bad.append((f"agent:bad{i}:payment.charge:acct-{i}", event))
                else:
                    bad.append((event.idempotency_key, codec.encode(event.to_record())))
                if reason:
                    expected[reason] += 1
            streams.append(bad)
    return _interleave(streams, rng), expected


def _interleave(streams: list[list[Item]], rng: random.Random) -> list[Item]:
    """Merge per-key streams keeping each key's order, mixing up to 64 keys at a time like
    concurrent workers do."""
    out: list[Item] = []
    window: list[list[Item]] = []
    for stream in streams:
        window.append(list(reversed(stream)))
        while len(window) >= 64:
            _take(window, rng, out)
    while window:
        _take(window, rng, out)
    return out


def _take(window: list[list[Item]], rng: random.Random, out: list[Item]) -> None:
    pick = rng.randrange(len(window))
    out.append(window[pick].pop())
    if not window[pick]:
        window[pick] = window[-1]
        window.pop()


def write(log: EventLog, items: list[Item], chunk: int = 5000) -> None:
    for start in range(0, len(items), chunk):
        log.append_many(EVENTS, items[start:start + chunk])
