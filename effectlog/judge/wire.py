"""The JSON the judge's HTTP route speaks (``POST /v1/judge``), on both sides.

A request is ``{"judge": F, "timeout_ms": T, "queries": [Q, ...]}`` with each ``Q`` as
``{"key": K, "written": [[offset, event_id], ...], "after": N|null, "fresh": bool}``. The
answer is ``{"answers": [A, ...], "unanswered": [U, ...]}``: each ``A`` is
``{"key", "partition", "applied", "snapshot", "verdicts": [[offset, event_id, accepted,
reason], ...], "premises": {"topic_id", "generation", "judge", "served_by"}}``, each ``U``
``{"key", "partition", "reason"}`` for a key no member could answer in time (restoring,
rebalancing, moved), which the asker asks again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from effectlog.errors import InvalidInput
from effectlog.judge.query import Answer, Premises, Query, Verdict, Written

#: Queries one request may carry.
MAX_QUERIES = 512


def query_json(query: Query) -> dict[str, Any]:
    return {"key": query.key, "written": [[w.offset, w.event_id] for w in query.written],
            "after": query.after, "fresh": query.fresh}


def parse_query(value: Any) -> Query:
    """A query from its JSON; :class:`InvalidInput` for anything malformed."""
    try:
        key = value["key"]
        written = tuple(Written(_offset(o), str(e)) for o, e in value.get("written") or ())
        after = value.get("after")
        fresh = value.get("fresh", False)
    except (TypeError, KeyError, ValueError) as exc:
        raise InvalidInput(f"malformed query {str(value)[:200]}: {exc}") from None
    if not isinstance(key, str) or not key or not isinstance(fresh, bool):
        raise InvalidInput(f"malformed query {str(value)[:200]}: needs a key (and fresh a bool)")
    return Query(key, written, None if after is None else _offset(after), fresh)


def parse_request(body: Any) -> tuple[str, int | None, list[Query]]:
    """(judge fingerprint, timeout ms, queries) of a request body."""
    if not isinstance(body, dict):
        raise InvalidInput("a judge request is a JSON object")
    judge, timeout, queries = body.get("judge"), body.get("timeout_ms"), body.get("queries")
    if not isinstance(judge, str) or not judge:
        raise InvalidInput("a judge request names the asker's fingerprint (\"judge\")")
    if timeout is not None and (not isinstance(timeout, int) or isinstance(timeout, bool)
                                or not 0 <= timeout <= 60_000):
        raise InvalidInput("timeout_ms must be an integer from 0 to 60000")
    if not isinstance(queries, list) or not 1 <= len(queries) <= MAX_QUERIES:
        raise InvalidInput(f"a judge request carries 1 to {MAX_QUERIES} queries")
    return judge, timeout, [parse_query(q) for q in queries]


def answer_json(answer: Answer) -> dict[str, Any]:
    p = answer.premises
    return {"key": answer.key, "partition": answer.partition, "applied": answer.applied,
            "snapshot": answer.snapshot,
            "verdicts": [[v.offset, v.event_id, v.accepted, v.reason] for v in answer.verdicts],
            "premises": {"topic_id": p.topic_id, "generation": p.generation, "judge": p.judge,
                         "served_by": p.served_by}}


def parse_answer(value: Mapping[str, Any]) -> Answer:
    """An answer from its JSON; :class:`ValueError` (or KeyError, TypeError) if malformed."""
    from effectlog.model import EffectEvent

    snapshot = value["snapshot"]
    premises = value["premises"]
    return Answer(
        key=str(value["key"]), partition=int(value["partition"]), applied=int(value["applied"]),
        state=None if snapshot is None else EffectEvent.from_json(snapshot),
        verdicts=tuple(Verdict(int(o), str(e), a is True, None if r is None else str(r))
                       for o, e, a, r in value["verdicts"]),
        premises=Premises(_opt_str(premises["topic_id"]), str(premises["generation"]),
                          str(premises["judge"]), str(premises["served_by"])),
        snapshot=snapshot)


def answers_json(answers: Sequence[Answer],
                 unanswered: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    return {"answers": [answer_json(a) for a in answers], "unanswered": list(unanswered)}


def _offset(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**63:
        raise ValueError(f"offset {value!r} is not a non-negative integer")
    return value


def _opt_str(value: Any) -> str | None:
    return None if value is None else str(value)
