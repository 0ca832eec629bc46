"""What both worker shells share: the write strategy a worker uses on its log, the dispatched
call handed to the provider, and how an exception from the provider call is written down."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from effectlog.codec import Codec, event_codec
from effectlog.errors import EffectlogError, InvalidInput
from effectlog.log.base import EVENTS, EventLog, Position
from effectlog.model import EffectEvent, Outcome
from effectlog.provider import ProviderFailed
from effectlog.worker.conditional import ConditionalWrites
from effectlog.worker.core import WorkerCore
from effectlog.worker.judged import JudgedWrites
from effectlog.worker.writes import Writes

if TYPE_CHECKING:
    from effectlog.judge.query import Judge

UNRECORDED = "the effect block ended without recording an outcome"
SERVER_ENV = "EFFECTLOG_SERVER"

logger = logging.getLogger(__name__)


def unknown_reason(exc: BaseException) -> str:
    """What an UNKNOWN written for an exception from the provider call says."""
    return f"{type(exc).__name__}: {exc}"[:500]


def failed_result(exc: ProviderFailed) -> Any:
    """The result a FAILED record keeps for a definitive refusal."""
    return exc.result if exc.result is not None else {"error": str(exc)}


def codec_fingerprint(codec: Codec) -> str:
    """The judge fingerprint of a worker writing with ``codec``."""
    from effectlog.judge.premises import judge_fingerprint
    from effectlog.machine import RULES_VERSION

    return judge_fingerprint(RULES_VERSION, codec.fingerprint)


def open_judge(log: EventLog, judge: Judge | None, server: str | Sequence[str] | None,
               codec: Codec, wait_s: float) -> tuple[Judge | None, bool]:
    """The judge a worker on ``log`` asks, and whether the worker owns it (closes it).

    A given ``judge`` (share one among the workers of a process: their questions then go
    out together); else ``server`` (``$EFFECTLOG_SERVER`` on a log without compare-and-append);
    else None: the worker appends conditionally (SQLite, memory), or is refused with one line.
    """
    if judge is not None:
        return judge, False
    servers = server or (None if log.conditional else os.environ.get(SERVER_ENV))
    if not servers:
        if log.conditional:
            return None, False
        raise InvalidInput(f"a worker on {log.url} needs the judge of `effectlog serve` (the "
                           f"log has no compare-and-append): pass server=URL or judge=..., or "
                           f"set {SERVER_ENV}=http://host:port")
    from effectlog.judge.client import ClusterJudge

    return ClusterJudge(servers, wait_s=wait_s, fingerprint=codec_fingerprint(codec)), True


def writes_for(log: EventLog, judge: Judge | None, verify: bool, codec: Codec) -> Writes:
    """The write strategy: judged by ``judge`` when there is one, else conditional appends.

    ``verify=False`` asked a worker not to wait for its writes to be judged; no write may be
    unjudged where a provider call depends on it, so it is refused unless the log accepts
    each write as it is written (compare-and-append), where it changes nothing."""
    if judge is not None:
        if not verify:
            raise InvalidInput(f"verify=False is refused on {log.url}: without "
                               "compare-and-append every write waits for the judge's verdict")
        return JudgedWrites(codec_fingerprint(codec),
                            lambda key: log.partition_for(EVENTS, key))
    return ConditionalWrites()


class CallBase:
    """The dispatched effect handed to the provider call: key, epoch, payload, outcome."""

    def __init__(self, event: EffectEvent, payload: Any, done: bool = False) -> None:
        self.event = event
        self.payload = payload
        self.done = done
        self.outcome: Outcome | None = event.outcome if done else None

    @property
    def key(self) -> str:
        return self.event.idempotency_key

    @property
    def fencing_epoch(self) -> int:
        return self.event.fencing_epoch

    @property
    def payload_hash(self) -> str:
        return self.event.payload_hash

    @property
    def result(self) -> Any:
        """The recorded result (for an effect that was already done, the original one)."""
        return self.outcome.result if self.outcome else None


class WorkerBase:
    """What both shells share: the core, the judge, and the settings they were made with."""

    _core: WorkerCore
    log: EventLog
    judge: Judge | None
    verify: bool
    accept_timeout_s: float

    def _setup(self, log: EventLog, worker_id: str, judge: Judge | None,
               server: str | Sequence[str] | None, verify: bool, max_payload_bytes: int,
               accept_timeout_s: float, codec: Codec | None) -> None:
        from effectlog.worker.core import default_worker_id

        codec = codec or event_codec()
        self.log = log
        self.verify = verify
        self.accept_timeout_s = accept_timeout_s
        self.judge, self._owns_judge = open_judge(log, judge, server, codec, accept_timeout_s)
        writes = writes_for(log, self.judge, verify, codec)
        self._core = WorkerCore(worker_id or default_worker_id(), writes,
                                max_payload_bytes=max_payload_bytes, codec=codec,
                                call_within_s=accept_timeout_s)

    @property
    def worker_id(self) -> str:
        return self._core.worker_id

    @property
    def max_payload_bytes(self) -> int:
        return self._core.max_payload_bytes

    @property
    def last_position(self) -> Position | None:
        """Where the last accepted event of this worker sits in the log."""
        return self._core.last_position

    @last_position.setter
    def last_position(self, position: Position | None) -> None:
        self._core.last_position = position

    def _warm(self) -> None:
        """Connect the log now (on Kafka: the producer and its idempotent producer id), so no
        first call pays for it; a log that does not answer is left to the first call, which
        reports it."""
        try:
            self.log.connect()
        except EffectlogError as exc:
            logger.info("worker %s: not connected at open (%s); the first call tries again",
                        self.worker_id, exc)

    def _close_judge(self) -> None:
        if self._owns_judge and self.judge is not None:
            self.judge.close()
