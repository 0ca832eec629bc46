"""Backend-independent exception tree; the CLI maps each branch to one exit code."""

from __future__ import annotations


class EffectlogError(Exception):
    """Base of every error effectlog raises on purpose."""

    exit_code = 1


class NotFound(EffectlogError):
    """The key, position or record asked for does not exist (exit 1)."""

    exit_code = 1


class InvalidInput(EffectlogError):
    """Malformed key, kind, target, payload or command input (exit 2)."""

    exit_code = 2


class CodecError(InvalidInput):
    """Bytes that are not a record effectlog can decode."""


class UnknownWriterSchema(CodecError):
    """A single-object record whose writer schema this release does not know (a newer
    writer's, or not an effectlog record at all)."""


class Conflict(EffectlogError):
    """The request contradicts what the log already says (exit 3)."""

    exit_code = 3
    reason = "conflict"


class PayloadMismatch(Conflict):
    """Same idempotency key with a different payload, kind, target or operation."""

    reason = "payload_mismatch"


class IllegalTransition(Conflict):
    """The transition is not allowed from the key's current state."""

    reason = "illegal_transition"


class NotSettled(Conflict):
    """An expiry (a tombstone) for a key that is not settled: open, or unknown."""

    reason = "not_settled"


class ExpiresAnother(Conflict):
    """An expiry (a tombstone) naming an effect the key no longer holds: the key expired and
    was used again since, and this second expiry would remove the new effect."""

    reason = "expires_another"


class Fenced(Conflict):
    """The writer's fencing epoch is stale or owned by another worker."""

    reason = "fenced"

    def __init__(self, message: str, reason: str = "fenced") -> None:
        super().__init__(message)
        self.reason = reason


class BackendUnavailable(EffectlogError):
    """The log, broker or store could not be reached within the timeout (exit 4)."""

    exit_code = 4


class LogMissing(InvalidInput):
    """The log a URL names does not exist, and the caller may not create it (exit 2)."""


class WrongLog(BackendUnavailable):
    """The log is missing, has another identity, or ends before the offsets that state
    built from it has stored: the state belongs to another log (exit 4)."""

    HINT = "restore that log, or run `effectlog rebuild` to adopt this one"
