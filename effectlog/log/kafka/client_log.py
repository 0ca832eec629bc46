"""librdkafka's own log lines, routed to Python logging one level down.

librdkafka logs what it retries by itself at WARNING or ERROR: a broker connection refused
during a restart, "Failed to acquire idempotence PID … Coordinator load in progress" on a
fresh broker. effectlog reports the failures that matter where they happen (an append's
delivery report, a read that times out: :class:`~effectlog.errors.BackendUnavailable`), so
these lines go to the ``effectlog.log.kafka.librdkafka`` logger at INFO (DEBUG stays DEBUG):
shown with ``--log-level info``, never on stderr at the default level. Only CRITICAL (an
assertion, a fatal error) keeps its level.
"""

from __future__ import annotations

import logging
from typing import Any

LOGGER = logging.getLogger("effectlog.log.kafka.librdkafka")


class ClientLog:
    """What confluent-kafka's ``logger`` setting calls: ``log(level, fmt, *args)``."""

    def __init__(self, logger: logging.Logger = LOGGER) -> None:
        self.logger = logger

    def log(self, level: int, msg: str, *args: Any) -> None:
        if level < logging.CRITICAL:
            level = min(level, logging.INFO)
        self.logger.log(level, msg, *args)


CLIENT_LOG = ClientLog()
