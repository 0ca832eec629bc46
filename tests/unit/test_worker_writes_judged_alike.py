"""The worker's two write strategies judge as the projector does, event by event.

- Judged logs: each verdict is taken by its event and offset, never by its place in the
  answer (an answer listing a negative verdict on the worker's own DISPATCH first is no
  positive verdict on it).
- Compare-and-append logs: every event of a group is checked on the state before it, so a
  group whose later event the rules reject is refused whole (it used to be appended, and its
  last event remembered as the key's state: a rejected RECORD then replayed as a success).
- The fold a compare-and-append worker judges on leaves out an event logged under another
  key, as the projector rejects it (``key_mismatch``), decodes with the worker's own codec,
  and cannot judge a record of a writer schema it does not know (a newer release's).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from effectlog.codec import EVENT_SCHEMA, Codec, event_codec, load_schema_text
from effectlog.errors import Conflict
from effectlog.judge import CannotJudge
from effectlog.judge.query import Answer, Query, Verdict
from effectlog.log import open_log
from effectlog.log.base import EVENTS
from effectlog.machine import advance, new_effect
from effectlog.model import Outcome, State, Transition
from effectlog.view import LogView
from effectlog.worker import Worker
from tests.judges import FoldingJudge, LyingJudge

KIND, TARGET = "payment.charge", "acct:42"


def own_dispatch_refused_and_listed_first(query: Query, answer: Answer) -> Answer:
    if len(query.written) < 2:
        return answer
    *rest, last = answer.verdicts
    return replace(answer, verdicts=(Verdict(last.offset, last.event_id, False, "stale_epoch"),
                                     *rest))


def test_a_negative_verdict_on_the_own_dispatch_listed_first_is_no_call(tmp_path: Path) -> None:
    log = open_log(f"sqlite:///{tmp_path}/e.db")
    worker = Worker(log, "w1",
                    judge=LyingJudge(FoldingJudge(log), own_dispatch_refused_and_listed_first))
    calls: list[str] = []
    with pytest.raises(Conflict):
        worker.perform("op-1", KIND, TARGET, {"cents": 1}, lambda call: calls.append(call.key))
    assert calls == []
    log.close()


@pytest.mark.parametrize("url", ["memory://", "sqlite"])
def test_a_group_whose_later_event_is_illegal_is_refused_whole(url: str,
                                                                tmp_path: Path) -> None:
    log = open_log(url if url == "memory://" else f"sqlite:///{tmp_path}/e.db")
    worker = Worker(log, "w1")
    key = worker.create("op-1", KIND, TARGET, {"cents": 100}).idempotency_key
    reserved = worker.reserve(key)
    claim = advance(reserved, Transition.CLAIM, "w1")  # epoch 2: legal on its own
    stale = advance(reserved, Transition.RECORD, "w1",  # epoch 1: stale after the claim
                    outcome=Outcome(State.SUCCEEDED, {"charged": True}, "worker"))
    written = len(log.read(EVENTS, 0, 0, 100))
    with pytest.raises(Conflict, match="stale"):
        worker.write(claim, stale)
    assert len(log.read(EVENTS, 0, 0, 100)) == written  # nothing appended
    calls: list[str] = []
    worker.perform("op-1", KIND, TARGET, {"cents": 100},
                   lambda call: calls.append(call.key) or {"charged": "once"})
    assert calls == [key]  # the provider is called: no rejected RECORD replayed
    assert LogView(log).current(key).state is State.SUCCEEDED  # type: ignore[union-attr]
    log.close()


def test_the_fold_leaves_out_an_event_logged_under_another_key() -> None:
    log = open_log("memory://")
    other = new_effect("op-X", "email.send", "mailto:x@example.com", {"n": 1}, "w9")
    mine = f"agent:op-1:{KIND}:{TARGET}"
    log.append(EVENTS, mine, event_codec().encode(other.to_record()))
    assert LogView(log).current(mine) is None
    calls: list[str] = []
    Worker(log, "w1").perform("op-1", KIND, TARGET, {"cents": 1},
                              lambda call: calls.append(call.key) or {})
    assert calls == [mine]


def newer_codec() -> Codec:
    """The next release's writer schema: this one plus an optional field."""
    current = load_schema_text(EVENT_SCHEMA)
    newer = {**current, "fields": [*current["fields"],
                                   {"name": "trace_id", "type": ["null", "string"],
                                    "default": None}]}
    return Codec(newer, older=[current])


def test_a_worker_of_an_older_release_cannot_judge_a_newer_ones_records(
        tmp_path: Path) -> None:
    """On a compare-and-append log the worker's fold is the verdict: a record of a writer
    schema it does not know is "cannot judge" (it would call it undecodable, rejected, and
    write its own DISPATCH after a key the newer release settled), never skipped."""
    url = f"sqlite:///{tmp_path}/events.db"
    calls: list[str] = []
    newer = Worker(open_log(url), "w-new", codec=newer_codec())
    newer.perform("order-7", KIND, TARGET, {"cents": 100},
                  lambda call: calls.append("newer") or {"id": 1})
    older = Worker(open_log(url), "w-old")
    with pytest.raises(CannotJudge, match="written by another release"):
        older.perform("order-7", KIND, TARGET, {"cents": 100},
                      lambda call: calls.append("older") or {"id": 2})
    assert calls == ["newer"]
    again = newer.perform("order-7", KIND, TARGET, {"cents": 100},
                          lambda call: calls.append("newer again") or {"id": 3})
    assert again == {"id": 1} and calls == ["newer"]  # its own release reads its records
