"""Event log backends behind one port, picked by URL scheme."""

from __future__ import annotations

from effectlog.errors import InvalidInput, LogMissing
from effectlog.log.base import COMMANDS, EVENTS, TOPICS, EventLog, Position, Record

__all__ = ["COMMANDS", "EVENTS", "TOPICS", "EventLog", "LogMissing", "Position", "Record",
           "check_log_url", "open_log"]

_SCHEMES = ("memory", "sqlite", "kafka", "kafka+ssl", "kafka+sasl")


def check_log_url(url: str) -> None:
    """Raise :class:`InvalidInput` unless a backend takes ``url``'s scheme (opens nothing)."""
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme not in _SCHEMES:
        from effectlog.redact import redact_url
        from effectlog.text import shorten

        raise InvalidInput(f"unsupported log URL {shorten(redact_url(url))}: use memory://, "
                           "sqlite:///path or kafka://host:port")


def open_log(url: str, *, create: bool = True) -> EventLog:
    """Open the event log named by ``url``: ``memory://``, ``sqlite:///path``, ``kafka://host:port``.

    With ``create=False`` a log that does not exist yet raises :class:`LogMissing` instead
    of being created (read commands never create one). Backends are imported lazily so
    that a SQLite user never imports confluent-kafka.
    """
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme == "memory":
        from effectlog.log.memory import MemoryLog

        return MemoryLog(url)
    if scheme == "sqlite":
        from effectlog.log.sqlite import SqliteLog

        return SqliteLog.from_url(url, create=create)
    check_log_url(url)
    from effectlog.log.kafka import KafkaLog, KafkaSettings
    from effectlog.log.security import check_client_security

    check_client_security(KafkaSettings.from_url(url).client_config())
    return KafkaLog.from_url(url)
