"""The premises of a judge's answer, and the checks a writer makes on every answer.

An answer is only as good as what it rests on. A writer acts on it only when it answers the
question asked (the key, its partition, the writer's own events at their offsets), reaches far
enough (everything below the offsets asked about applied), comes from a projection of the log
the writer writes to (the events topic's ID), and was judged with the rules and writer schema
the writer wrote with (the judge fingerprint). Each check can fail: a judge that is out of
date, restored from elsewhere, moved, or of another release is refused, never trusted.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from effectlog.errors import BackendUnavailable, WrongLog
from effectlog.judge.query import Answer, Query


class JudgeMismatch(BackendUnavailable):
    """An answer that does not answer the question asked, or rests on a premise that does
    not hold (exit 4): the writer acts on nothing it says."""


class CannotJudge(JudgeMismatch):
    """The judge does not know the rules or writer schema the writer wrote with (a rolling
    upgrade half done): it cannot judge the writer's events, so nothing is acted on."""


def judge_fingerprint(rules_version: int, schema_fingerprint: bytes) -> str:
    """The fingerprint of judging events of one writer schema with one version of the rules."""
    return hashlib.sha256(b"rules-%d:" % rules_version + schema_fingerprint).hexdigest()[:16]


def worker_fingerprint() -> str:
    """This release's fingerprint as a writer: its rules and the schema it writes with."""
    from effectlog.codec import event_codec
    from effectlog.machine import RULES_VERSION

    return judge_fingerprint(RULES_VERSION, event_codec().fingerprint)


def known_fingerprints(writer_schemas: Iterable[bytes]) -> frozenset[str]:
    """The writer fingerprints a judge of this release can judge: its rules, each writer
    schema its codec decodes."""
    from effectlog.machine import RULES_VERSION

    return frozenset(judge_fingerprint(RULES_VERSION, f) for f in writer_schemas)


@dataclass(frozen=True, slots=True)
class Expected:
    """What a writer knows independently of the judge: the fingerprint it writes with, where
    its keys live, and the identity of the log it writes to (None: the log cannot tell)."""

    judge: str
    partition_of: Callable[[str], int]
    topic_id: Callable[[], str | None]


def check_answer(query: Query, answer: Answer, expected: Expected) -> None:
    """Raise unless ``answer`` answers ``query`` on premises that hold for this writer."""
    key = query.key
    if answer.key != key:
        raise JudgeMismatch(f"asked about {key}, the judge answered about {answer.key}")
    partition = expected.partition_of(key)
    if answer.partition != partition:
        raise JudgeMismatch(f"{key} lives in partition {partition}, the judge answered from "
                            f"partition {answer.partition}")
    premises = answer.premises
    if premises.judge != expected.judge:
        raise CannotJudge(f"{premises.served_by} judges with fingerprint {premises.judge}, this "
                          f"writer writes with {expected.judge} (another release of the rules "
                          "or schema): upgrade the serve instances first, then the writers")
    topic_id = expected.topic_id()
    if topic_id is not None and premises.topic_id != topic_id:
        raise WrongLog(f"{premises.served_by} projects events topic {premises.topic_id}, but "
                       f"this writer writes to topic {topic_id}: the topic was replaced; "
                       f"{WrongLog.HINT}")
    needed = query.applied_at_least
    if answer.applied < needed:
        raise JudgeMismatch(f"{premises.served_by} answered for {key} from offset "
                            f"{answer.applied} of partition {partition}, short of {needed}")
    for written in query.written:
        verdict = answer.verdict(written)
        if verdict is None:
            raise JudgeMismatch(f"{premises.served_by} gave no verdict on event "
                                f"{written.event_id} at offset {written.offset} of {key}")
    if answer.state is not None and answer.state.idempotency_key != key:
        raise JudgeMismatch(f"the judge's state for {key} is of key "
                            f"{answer.state.idempotency_key}")
