"""An at-least-once job queue feeding a pool of worker processes.

Each worker process holds at most one job. A job is dropped only when its worker
acknowledges it; when a worker dies (the demo SIGKILLs them) its job goes back to the
queue and a replacement process starts, as a job queue re-delivers after a crash. A job
its worker gave back (the log unreachable) is delivered again after a growing delay.
Workers speak JSON lines: a job on stdin, a reply on stdout.
"""

from __future__ import annotations

import contextlib
import heapq
import json
import logging
import os
import selectors
import signal
import subprocess
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

from effectlog.cli.demo.workload import Job
from effectlog.errors import EffectlogError

logger = logging.getLogger(__name__)

MAX_DELIVERIES = 10  # then the job is dead-lettered
MAX_FAILURES = 5     # worker processes in a row that die without being killed: give up
#: A job whose worker could not reach the log waits before its next delivery, doubling from
#: this up to RETRY_CAP_S (about 25 s in all before a dead letter): an outage of the log or
#: of every serve instance is waited out rather than burning the deliveries in a second.
RETRY_BASE_S = 0.2
RETRY_CAP_S = 5.0


@dataclass
class QueueStats:
    """What happened to the jobs of one run."""

    jobs: int = 0
    deliveries: int = 0
    acked: int = 0
    crashes: int = 0          # worker processes SIGKILLed holding a job
    failures: int = 0         # worker processes that exited otherwise
    dead_lettered: int = 0
    statuses: Counter[str] = field(default_factory=Counter)
    stale_rejected: int = 0    # worker writes refused because another owner took over
    provider_refused: int = 0  # calls the provider refused for a stale fencing epoch

    @property
    def done(self) -> int:
        return self.acked + self.dead_lettered


@dataclass
class _Slot:
    """One worker process and the job it holds."""

    name: str
    proc: subprocess.Popen[bytes]
    buffer: bytes = b""
    holding: tuple[int, int] | None = None  # (job index, delivery number)


ProgressFn = Callable[[QueueStats], None]


class WorkerPool:
    """Runs ``jobs`` through ``size`` worker processes started by ``command(name)``."""

    def __init__(self, jobs: Sequence[Job], size: int, command: Callable[[str], list[str]],
                 stderr: IO[bytes], on_progress: ProgressFn | None = None,
                 env: dict[str, str] | None = None,
                 on_reply: Callable[[Job, dict[str, Any]], None] | None = None) -> None:
        self.jobs = jobs
        self.env = env
        self.on_reply = on_reply
        self.size = size
        self.command = command
        self.stderr = stderr
        self.on_progress = on_progress
        self.stats = QueueStats(jobs=len(jobs))
        self._pending: deque[tuple[int, int]] = deque((i, 1) for i in range(len(jobs)))
        self._delayed: list[tuple[float, int, int]] = []  # (due, job index, delivery), a heap
        self._selector = selectors.DefaultSelector()
        self._started = 0
        self._failures_in_a_row = 0

    def run(self) -> QueueStats:
        """Deliver every job until it is acknowledged (or dead-lettered); then stop workers."""
        slots = [self._spawn() for _ in range(self.size)]
        last_report = 0.0
        try:
            while self.stats.done < len(self.jobs):
                while self._delayed and self._delayed[0][0] <= time.monotonic():
                    _, index, delivery = heapq.heappop(self._delayed)
                    self._pending.append((index, delivery))
                for slot in slots:
                    if slot.holding is None and self._pending:
                        self._deliver(slot)
                for key, _ in self._selector.select(timeout=0.1):
                    slot = key.data
                    self._read(slot, slots)
                now = time.monotonic()
                if self.on_progress is not None and now - last_report > 0.1:
                    last_report = now
                    self.on_progress(self.stats)
        finally:
            for slot in slots:
                self._stop(slot)
            self._selector.close()
        if self.on_progress is not None:
            self.on_progress(self.stats)
        return self.stats

    # -- internals -----------------------------------------------------------------------

    def _spawn(self) -> _Slot:
        self._started += 1
        name = f"w{self._started}"
        proc = subprocess.Popen(self.command(name), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=self.stderr, env=self.env)
        assert proc.stdout is not None
        slot = _Slot(name, proc)
        self._selector.register(proc.stdout, selectors.EVENT_READ, slot)
        return slot

    def _deliver(self, slot: _Slot) -> None:
        index, delivery = self._pending.popleft()
        slot.holding = (index, delivery)
        self.stats.deliveries += 1
        line = json.dumps(self.jobs[index].message(delivery)) + "\n"
        try:
            assert slot.proc.stdin is not None
            slot.proc.stdin.write(line.encode("utf-8"))
            slot.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass  # it died meanwhile: the read side sees the end and re-delivers

    def _read(self, slot: _Slot, slots: list[_Slot]) -> None:
        assert slot.proc.stdout is not None
        chunk = os.read(slot.proc.stdout.fileno(), 65536)
        if not chunk:
            self._died(slot, slots)
            return
        slot.buffer += chunk
        while b"\n" in slot.buffer:
            line, slot.buffer = slot.buffer.split(b"\n", 1)
            self._reply(slot, json.loads(line))

    def _reply(self, slot: _Slot, reply: dict[str, Any]) -> None:
        if slot.holding is None:
            return
        index, delivery = slot.holding
        slot.holding = None
        self._failures_in_a_row = 0
        if self.on_reply is not None:
            self.on_reply(self.jobs[index], reply)
        self.stats.statuses[str(reply.get("status"))] += 1
        self.stats.stale_rejected += int(bool(reply.get("stale")))
        self.stats.provider_refused += int(bool(reply.get("provider_refused")))
        if reply.get("ack"):
            self.stats.acked += 1
        else:
            self._again(index, delivery, min(RETRY_CAP_S, RETRY_BASE_S * 2 ** (delivery - 1)))

    def _died(self, slot: _Slot, slots: list[_Slot]) -> None:
        assert slot.proc.stdout is not None
        self._selector.unregister(slot.proc.stdout)
        code = slot.proc.wait()
        if code == -signal.SIGKILL:
            self.stats.crashes += int(slot.holding is not None)
        else:
            self.stats.failures += 1
            self._failures_in_a_row += 1
            logger.warning("demo worker %s exited with %s", slot.name, code)
        if slot.holding is not None:
            self._again(*slot.holding)
        self._close(slot)
        if self._failures_in_a_row >= MAX_FAILURES:
            raise EffectlogError(f"{MAX_FAILURES} worker processes in a row exited on their own "
                                 f"(last: exit {code}); their stderr is in the demo's workers.log")
        slots[slots.index(slot)] = self._spawn()

    def _again(self, index: int, delivery: int, delay_s: float = 0.0) -> None:
        if delivery >= MAX_DELIVERIES:
            self.stats.dead_lettered += 1
            logger.warning("job %s dead-lettered after %d deliveries",
                           self.jobs[index].operation_id, delivery)
            return
        if delay_s > 0:
            heapq.heappush(self._delayed, (time.monotonic() + delay_s, index, delivery + 1))
        else:
            self._pending.append((index, delivery + 1))

    def _stop(self, slot: _Slot) -> None:
        if slot.proc.poll() is None:
            try:
                assert slot.proc.stdin is not None
                slot.proc.stdin.close()  # end of input: the worker exits
                slot.proc.wait(10)
            except (OSError, subprocess.TimeoutExpired):
                slot.proc.kill()
                slot.proc.wait()
        self._close(slot)

    @staticmethod
    def _close(slot: _Slot) -> None:
        for pipe in (slot.proc.stdin, slot.proc.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()
