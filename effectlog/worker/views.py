"""Which state view a worker reads through when none is given: the log itself where reading
one key is an index lookup, the projection cluster's query API where it would scan."""

from __future__ import annotations

import os
from collections.abc import Sequence

from effectlog.errors import InvalidInput
from effectlog.log.base import EventLog
from effectlog.view import StateView

SERVER_ENV = "EFFECTLOG_SERVER"


def default_view(log: EventLog, server: str | Sequence[str] | None = None) -> StateView | None:
    """None when the worker may fold keys from ``log`` itself (SQLite, memory); else a
    :class:`~effectlog.client.ClusterView` on ``server`` or ``$EFFECTLOG_SERVER``.

    On Kafka a worker never scans a partition to learn a key's state: without a server it is
    refused here, with a clear error, rather than run at a second per effect.
    """
    if server is None and log.indexed_keys:
        return None
    servers = server or os.environ.get(SERVER_ENV)
    if not servers:
        raise InvalidInput(f"a worker on {log.url} reads state through `effectlog serve`: pass "
                           f"server=URL or set {SERVER_ENV}=http://host:port (or give a view)")
    from effectlog.client import ClusterView

    return ClusterView(servers)
