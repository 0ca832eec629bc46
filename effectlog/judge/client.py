"""The judge of a group of ``effectlog serve`` instances, over HTTP (``POST /v1/judge``).

Any member answers any key: it answers keys of partitions it serves and forwards the others
to their owners. A member that does not answer is skipped for the next; a question no member
could answer yet (a partition restoring or moving) is asked again after a short pause until
``retry_for_s`` has passed, then :class:`~effectlog.errors.BackendUnavailable` is raised:
never a false answer. Questions from many threads sharing one :class:`ClusterJudge` go out
together (:mod:`.batcher`); give the workers of a process one judge to share.
"""

from __future__ import annotations

import http.client
import json
import logging
import time
from collections.abc import Mapping, Sequence
from urllib.parse import urlsplit

from effectlog.errors import BackendUnavailable, InvalidInput
from effectlog.http_get import KeepAliveGets
from effectlog.judge.batcher import Batcher
from effectlog.judge.premises import CannotJudge, worker_fingerprint
from effectlog.judge.query import Answer, Query
from effectlog.judge.wire import MAX_QUERIES, parse_answer, query_json

logger = logging.getLogger(__name__)

PATH = "/v1/judge"
#: First pause before asking again about a question nobody could answer (doubling to 0.5 s).
RETRY_PAUSE_S = 0.02
#: How long past its deadline a question's last request may still be read.
GRACE_S = 0.5


def server_list(spec: str | Sequence[str]) -> list[str]:
    """``http://a:9464,http://b:9464`` (or a sequence) as a list of base URLs."""
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    servers = [s.strip().rstrip("/") for s in items if s.strip()]
    for server in servers:
        if not server.startswith(("http://", "https://")):
            raise InvalidInput(f"server {server!r} must be an http:// or https:// URL")
    if not servers:
        raise InvalidInput("no server URL given")
    return servers


class ClusterJudge:
    """A :class:`~effectlog.judge.Judge` over serve instances at ``servers``.

    ``wait_s`` bounds how long a member waits for a partition to apply what a question needs;
    ``retry_for_s`` how long questions nobody could answer are asked again. A question is
    answered or raises within ``wait_s + retry_for_s`` (and half a second), even when a
    member holds its request: each request's read timeout ends with that deadline.
    """

    def __init__(self, servers: str | Sequence[str], *, timeout_s: float = 10.0,
                 wait_s: float = 10.0, retry_for_s: float = 10.0,
                 fingerprint: str | None = None) -> None:
        self.servers = server_list(servers)
        self.timeout_s = timeout_s
        self.wait_s = wait_s
        self.retry_for_s = retry_for_s
        self.fingerprint = fingerprint or worker_fingerprint()
        self._http = KeepAliveGets()
        self._prefix = [urlsplit(server).path for server in self.servers]  # behind a proxy path
        self._preferred = 0
        self._batcher: Batcher[Query, Answer] = Batcher(self._send_batch, lambda q: q.key)

    @property
    def batched(self) -> int:
        """Questions sent in a request with others so far."""
        return self._batcher.batched

    def ask(self, queries: Sequence[Query]) -> list[Answer]:
        if len(queries) == 1:
            return [self._batcher.ask(queries[0])]
        answers: list[Answer] = []
        for start in range(0, len(queries), MAX_QUERIES):
            chunk = queries[start:start + MAX_QUERIES]
            keys = [q.key for q in chunk]
            if len(set(keys)) != len(keys):  # one question per key and request
                answers.extend(self._batcher.ask(q) for q in chunk)
                continue
            found = self._send_batch(chunk)
            answers.extend(found[q.key] for q in chunk)
        return answers

    def close(self) -> None:
        self._http.close()

    # -- internals -----------------------------------------------------------------------

    def _send_batch(self, queries: Sequence[Query]) -> Mapping[str, Answer]:
        """Every query answered (asking again about unanswered ones), by key."""
        deadline = time.monotonic() + self.retry_for_s + self.wait_s
        answers: dict[str, Answer] = {}
        waiting = list(queries)
        pause = RETRY_PAUSE_S
        while True:
            found, unanswered = self._post(waiting, deadline)
            answers.update(found)
            waiting = [q for q in waiting if q.key not in answers]
            if not waiting:
                return answers
            if time.monotonic() + pause >= deadline:
                reasons = "; ".join(f"{u.get('key')}: {u.get('reason')}" for u in unanswered[:3])
                raise BackendUnavailable(f"the judge answered no question about {len(waiting)} "
                                         f"key(s) in time: {reasons or 'no answer'}")
            time.sleep(pause)
            pause = min(pause * 2, 0.5)

    def _post(self, queries: Sequence[Query], deadline: float
              ) -> tuple[dict[str, Answer], list[dict[str, object]]]:
        """One request to the first member that answers it."""
        wait_ms = int(max(0.0, min(self.wait_s, deadline - time.monotonic())) * 1000)
        body = json.dumps({"judge": self.fingerprint, "timeout_ms": wait_ms,
                           "queries": [query_json(q) for q in queries]}).encode("utf-8")
        problems: list[str] = []
        for step in range(len(self.servers)):
            index = (self._preferred + step) % len(self.servers)
            server = self.servers[index]
            # a member that holds the request past the deadline is not waited for
            left = max(0.0, deadline - time.monotonic())
            try:
                status, data, _ = self._http.post(
                    server, self._prefix[index] + PATH, body,
                    connect_timeout_s=min(2.0, self.timeout_s, left + 0.1),
                    read_timeout_s=min(self.timeout_s + wait_ms / 1000, left + GRACE_S))
            except (OSError, http.client.HTTPException) as exc:
                problems.append(f"{server}: {type(exc).__name__}")
                continue
            if status == 200:
                self._preferred = index
                return _parse(data, server)
            message = _message(data) or f"HTTP {status}"
            if status == 409:
                raise CannotJudge(message)
            if status in (404, 405):
                raise CannotJudge(f"{server} has no judge ({PATH}: HTTP {status}): an older "
                                  "release; upgrade serve first")
            if status == 400:
                raise InvalidInput(message)
            problems.append(f"{server}: {message}")
        return {}, [{"key": "*", "reason": "; ".join(problems[-3:]) or "no server answered"}]


def _parse(data: bytes, server: str) -> tuple[dict[str, Answer], list[dict[str, object]]]:
    try:
        body = json.loads(data)
        answers = [parse_answer(a) for a in body["answers"]]
        unanswered = [dict(u) for u in body["unanswered"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise BackendUnavailable(f"{server} answered malformed JSON: {exc}") from None
    return {a.key: a for a in answers}, unanswered


def _message(body: bytes) -> str | None:
    try:
        value = json.loads(body)
    except ValueError:
        return None
    return str(value["error"]) if isinstance(value, dict) and "error" in value else None
