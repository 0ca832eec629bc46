"""The reconciliation command (schemas/reconciliation_command.v1.avsc) as a typed record."""

from __future__ import annotations

import uuid
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from effectlog.codec import command_codec
from effectlog.model import EffectEvent, State, now_ms

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _to_ms(value: int | datetime) -> int:
    if isinstance(value, datetime):
        moment = value if value.tzinfo else value.replace(tzinfo=UTC)
        return (moment - _EPOCH) // timedelta(milliseconds=1)
    return int(value)


@dataclass(frozen=True, slots=True)
class ReconciliationCommand:
    """Ask a reconciler to settle one stuck effect, as the recovery consumer saw it."""

    idempotency_key: str
    kind: str
    target: str
    observed_state: str
    observed_epoch: int
    observed_at: int
    attempt: int
    reason: str
    payload_ref: str | None = None
    issued_at: int = field(default_factory=now_ms)
    command_id: str = field(default_factory=lambda: uuid.uuid4().hex)

    @classmethod
    def for_event(cls, event: EffectEvent, attempt: int, reason: str,
                  issued_at: int | None = None) -> ReconciliationCommand:
        """The command for the stuck snapshot ``event``."""
        return cls(idempotency_key=event.idempotency_key, kind=event.kind, target=event.target,
                   observed_state=event.state.value, observed_epoch=event.fencing_epoch,
                   observed_at=event.occurred_at, attempt=attempt, reason=reason,
                   payload_ref=event.payload_ref,
                   issued_at=now_ms() if issued_at is None else issued_at)

    def matches(self, event: EffectEvent) -> bool:
        """Whether ``event`` is still the snapshot this command was issued for."""
        return (State(self.observed_state), self.observed_epoch, self.observed_at) == (
            event.state, event.fencing_epoch, event.occurred_at)

    def summary(self) -> dict[str, Any]:
        """What ``recover`` reports about the command (and ``POST /v1/recover`` answers)."""
        return {"idempotency_key": self.idempotency_key, "state": self.observed_state,
                "fencing_epoch": self.observed_epoch, "attempt": self.attempt,
                "command_id": self.command_id, "reason": self.reason}

    def encode(self) -> bytes:
        """Avro single-object bytes for the commands topic."""
        return command_codec().encode(asdict(self))

    @classmethod
    def decode(cls, data: bytes) -> ReconciliationCommand:
        """Parse single-object bytes; raises :class:`~effectlog.errors.CodecError`."""
        rec: dict[str, Any] = command_codec().decode(data)
        return cls(idempotency_key=rec["idempotency_key"], kind=rec["kind"], target=rec["target"],
                   observed_state=rec["observed_state"], observed_epoch=int(rec["observed_epoch"]),
                   observed_at=_to_ms(rec["observed_at"]), attempt=int(rec["attempt"]),
                   reason=rec["reason"], payload_ref=rec.get("payload_ref"),
                   issued_at=_to_ms(rec["issued_at"]), command_id=rec["command_id"])
