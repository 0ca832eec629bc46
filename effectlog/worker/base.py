"""What both worker shells share: the dispatched call handed to the provider, the core's
identity and bookkeeping, and how an exception from the provider call is written down."""

from __future__ import annotations

from typing import Any

from effectlog.log.base import Position
from effectlog.model import EffectEvent, Outcome
from effectlog.provider import ProviderFailed
from effectlog.worker.core import WorkerCore

UNRECORDED = "the effect block ended without recording an outcome"


def unknown_reason(exc: BaseException) -> str:
    """What an UNKNOWN written for an exception from the provider call says."""
    return f"{type(exc).__name__}: {exc}"[:500]


def failed_result(exc: ProviderFailed) -> Any:
    """The result a FAILED record keeps for a definitive refusal."""
    return exc.result if exc.result is not None else {"error": str(exc)}


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
    """What both shells share: the core, and the identity and bookkeeping it keeps."""

    _core: WorkerCore

    @property
    def worker_id(self) -> str:
        return self._core.worker_id

    @property
    def verify(self) -> bool:
        return self._core.verify

    @property
    def max_payload_bytes(self) -> int:
        return self._core.max_payload_bytes

    @property
    def accept_timeout_s(self) -> float:
        return self._core.accept_timeout_s

    @property
    def last_position(self) -> Position | None:
        """Where the last accepted event of this worker sits in the log."""
        return self._core.last_position

    @last_position.setter
    def last_position(self, position: Position | None) -> None:
        self._core.last_position = position

    @property
    def _known(self) -> dict[str, tuple[EffectEvent | None, int | None]]:
        return self._core.known
