"""Event log backends behind one port, picked by URL scheme."""

from __future__ import annotations

from effectlog.errors import InvalidInput
from effectlog.log.base import COMMANDS, EVENTS, TOPICS, EventLog, Position, Record

__all__ = ["COMMANDS", "EVENTS", "TOPICS", "EventLog", "Position", "Record", "open_log"]


def open_log(url: str) -> EventLog:
    """Open the event log named by ``url``: ``memory://``, ``sqlite:///path``, ``kafka://host:port``.

    Backends are imported lazily so that a SQLite user never imports confluent-kafka.
    """
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme == "memory":
        from effectlog.log.memory import MemoryLog

        return MemoryLog(url)
    if scheme == "sqlite":
        from effectlog.log.sqlite import SqliteLog

        return SqliteLog.from_url(url)
    if scheme in ("kafka", "kafka+ssl", "kafka+sasl"):
        from effectlog.log.kafka import KafkaLog

        return KafkaLog.from_url(url)
    from effectlog.redact import redact_url

    raise InvalidInput(f"unsupported log URL {redact_url(url)!r}: use memory://, sqlite:///path "
                       "or kafka://host:port")
