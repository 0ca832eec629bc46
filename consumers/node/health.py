"""``/healthz``: whether a node is alive, with its figures, answered within a bound even while
the log does not answer.

Alive means no loop of the node has stopped (one that has makes ``serve`` exit): 200, or 503
naming the loops. A broker outage is not death (``serve`` rides it out, and a liveness probe
must not restart it for one), so it is reported, not failed: the projector lag needs the
log's end offsets, which an outage can hold up for the log's whole ``timeout_s``; a probe
waits for them at most ``wait_s`` (a Kubernetes probe gives up after 1 s by default); when
they do not come in time, or the log refuses, ``log_error`` says why, the lag is unknown
(null), and ``last_known`` holds the last end offsets and lag the node read, with their age
in seconds. One read of the end offsets is under way at a time: probes arriving meanwhile
wait on the same one, so an outage never piles up threads. Whether the node serves is
``/readyz`` (:mod:`.readiness`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from effectlog.errors import EffectlogError
from effectlog.metrics import projector_lag

if TYPE_CHECKING:
    from consumers.node.ports import ServedNode

#: How long ``/healthz`` waits for the log's end offsets before it answers without them.
DEFAULT_WAIT_S = 0.8


@dataclass(frozen=True, slots=True)
class LogFigures:
    """End offsets read from the log at ``at`` (monotonic), and the projector lag then."""

    at: float
    ends: Mapping[int, int]
    lag: int

    @classmethod
    def now(cls, ends: Mapping[int, int], held: Mapping[int, object],
            positions: Mapping[int, int]) -> LogFigures:
        """The figures of ``ends`` just read, with the lag over the partitions ``held``."""
        mine = {p: n for p, n in ends.items() if p in held}
        return cls(time.monotonic(), dict(ends), projector_lag(mine, positions))

    def as_json(self) -> dict[str, object]:
        return {"log_end_offsets": dict(self.ends), "projector_lag": self.lag,
                "age_s": round(time.monotonic() - self.at, 1)}


class HealthCheck:
    """Answers ``(alive, details)`` for one node within about ``wait_s`` (on its event loop)."""

    def __init__(self, node: ServedNode, wait_s: float = DEFAULT_WAIT_S,
                 read_ends: Callable[[], LogFigures] | None = None) -> None:
        self.node = node
        self.wait_s = wait_s
        self._read_ends = read_ends or node.read_log_figures
        self._reading: asyncio.Future[LogFigures] | None = None

    async def __call__(self) -> tuple[bool, dict[str, object]]:
        node = self.node
        details = await asyncio.to_thread(node.health_details)
        alive = not node.failed
        try:
            figures = await asyncio.wait_for(asyncio.shield(self._read()), self.wait_s)
        except TimeoutError:
            cause = f"the log did not answer within {self.wait_s:g}s"
        except EffectlogError as exc:
            cause = str(exc)
        else:
            details["log_end_offsets"] = dict(figures.ends)
            details["projector_lag"] = figures.lag
            return alive, details
        last = node.last_log_figures
        details["log_error"] = f"{cause}; projector lag unknown"
        details["projector_lag"] = None
        details["last_known"] = None if last is None else last.as_json()
        return alive, details

    def _read(self) -> asyncio.Future[LogFigures]:
        """The read under way, or a new one when none is."""
        if self._reading is None or self._reading.done():
            reading = asyncio.ensure_future(asyncio.to_thread(self._read_ends))
            # a read outlived by every probe that waited on it still has its error consumed
            reading.add_done_callback(lambda f: f.cancelled() or f.exception())
            self._reading = reading
        return self._reading
