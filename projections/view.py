"""Read-your-writes for workers on top of the projection (a :class:`effectlog.view.StateView`).

A worker appends, then asks :meth:`ProjectionView.accepted`: the view waits until the
projector has applied the event's position and answers from the rejected column family.
``current`` first waits until the projection has reached the log end of the key's
partition as seen at the call, so a worker never acts on a snapshot older than its own
writes. The projector runs elsewhere (``effectlog project``, a thread or ``serve``).
"""

from __future__ import annotations

import os
import threading
import time

from effectlog.errors import BackendUnavailable
from effectlog.log.base import EVENTS, EventLog, Position
from effectlog.model import EffectEvent
from projections.rocksdb.reader import RocksProjectionReader


class ProjectionView:
    """Current state and acceptance answers from the projection under ``state_dir``."""

    def __init__(self, log: EventLog, state_dir: str | os.PathLike[str], *,
                 poll_interval_s: float = 0.005, max_poll_interval_s: float = 0.05,
                 current_timeout_s: float = 10.0) -> None:
        self.log = log
        self.poll_interval_s = poll_interval_s
        self.max_poll_interval_s = max_poll_interval_s
        self.current_timeout_s = current_timeout_s
        self._reader = RocksProjectionReader(state_dir, "secondary")
        self._lock = threading.Lock()  # one catch-up at a time; rocksdict handles are shared

    def close(self) -> None:
        with self._lock:
            self._reader.close()

    def current(self, key: str) -> EffectEvent | None:
        """The key's snapshot once the projection has reached the log end seen now."""
        partition = self.log.partition_for(EVENTS, key)
        end = self.log.end_offsets(EVENTS).get(partition, 0)
        self._wait_past(partition, end - 1, self.current_timeout_s)
        with self._lock:
            return self._reader.get(key)

    def accepted(self, event: EffectEvent, position: Position, timeout: float = 10.0) -> bool:
        """Whether the event appended at ``position`` was accepted in log order.

        Raises :class:`BackendUnavailable` if the projector has not applied it in time.
        """
        self._wait_past(position.partition, position.offset, timeout)
        with self._lock:
            return self._reader.rejected_at(position) is None

    def _wait_past(self, partition: int, offset: int, timeout: float) -> None:
        """Block until the projection's next offset of ``partition`` is above ``offset``."""
        if offset < 0:
            return
        deadline = time.monotonic() + timeout
        interval = self.poll_interval_s
        while True:
            with self._lock:
                self._reader.refresh()
                applied = self._reader.next_offsets().get(partition, 0)
            if applied > offset:
                return
            if time.monotonic() >= deadline:
                raise BackendUnavailable(
                    f"the projection has not applied partition {partition} offset {offset} "
                    f"within {timeout}s (at {applied}); is `effectlog project` running?")
            time.sleep(interval)
            interval = min(interval * 2, self.max_poll_interval_s)
