"""Helpers of the broker fault tests: a broker fault, worker processes fed jobs through it,
CLI runs that are timed, and the checks made once the broker is back."""

from __future__ import annotations

import collections
import contextlib
import json
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from effectlog.codec import event_codec
from effectlog.errors import CodecError
from effectlog.log import EVENTS, open_log
from effectlog.log.kafka import KafkaSettings, create_topics
from projections.projector import Projector
from projections.rocksdb.digest import partition_digest
from tests.cluster_support import Serve, answer
from tests.kafka_broker import KafkaBroker
from tests.restore_support import RESTORED

FAULTS = ("pause", "kill")
TIMEOUT_S = 3.0  # the log URL's timeout_s and every client wait of the workers
EFFECTLOG = Path(sys.executable).with_name("effectlog")


def fault_url(broker: KafkaBroker, partitions: int = 2) -> str:
    """A log URL on topics of its own (created), with short broker waits."""
    url = (f"kafka://{broker.bootstrap}?prefix=f{uuid.uuid4().hex[:10]}"
           f"&partitions={partitions}&timeout_s={TIMEOUT_S:g}")
    create_topics(KafkaSettings.from_url(url))
    return url


@contextlib.contextmanager
def broker_away(broker: KafkaBroker, fault: str) -> Iterator[None]:
    """SIGSTOP the broker (``pause``) or SIGKILL it (``kill``); on leaving, SIGCONT it or
    start it again on the same port and data directory, whatever happened inside."""
    if fault == "pause":
        broker.pause()
    else:
        broker.kill()
    try:
        yield
    finally:
        if fault == "pause":
            broker.resume()
        else:
            broker.restart()


@dataclass
class Run:
    """A timed run of the installed ``effectlog`` script."""

    code: int
    stdout: str
    stderr: str
    elapsed_s: float


def cli(*args: str, timeout_s: float = 60.0) -> Run:
    started = time.monotonic()
    done = subprocess.run([str(EFFECTLOG), *args], capture_output=True, text=True,
                          timeout=timeout_s, stdin=subprocess.DEVNULL)
    return Run(done.returncode, done.stdout, done.stderr, time.monotonic() - started)


def assert_unavailable(run: Run, within_s: float, what: str) -> None:
    """Exit 4, one ``error:`` line on stderr and nothing on stdout, within ``within_s``."""
    lines = run.stderr.strip().splitlines()
    assert run.code == 4, (what, run.code, run.stderr[-2000:])
    assert len(lines) == 1 and lines[0].startswith("error: "), (what, run.stderr[-2000:])
    assert run.stdout == "", (what, run.stdout[:500])
    assert run.elapsed_s < within_s, (what, run.elapsed_s)


@dataclass
class Reply:
    op: str
    worker: str
    body: dict[str, Any]
    finished_at: float


@dataclass
class Feeder:
    """Worker processes (:mod:`tests.fault_worker`) fed jobs as an at-least-once queue
    would: a new job every ``pause_s`` per process up to ``limit``, and every job whose
    delivery was not acknowledged (the log was unreachable) delivered again.
    ``provider_options`` follow the fake provider's path in its URL (``?dedupe=0``)."""

    log_url: str
    provider: Path
    server: str
    provider_options: str = ""
    workers: int = 2
    limit: int = 30
    pause_s: float = 0.1
    replies: list[Reply] = field(default_factory=list)
    ops: list[str] = field(default_factory=list)
    hung: list[str] = field(default_factory=list)
    _pending: collections.deque[str] = field(default_factory=collections.deque)
    _acked: set[str] = field(default_factory=set)
    _in_flight: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _draining: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        # stderr goes to files: a pipe nobody reads fills up (librdkafka logs every failed
        # connection while the broker is away) and blocks the worker in its next write
        self._errors = [tempfile.TemporaryFile("w+")  # noqa: SIM115 - lives as long as the feeder
                        for _ in range(self.workers)]
        self.procs = [subprocess.Popen(
            [sys.executable, "-m", "tests.fault_worker", "--log", self.log_url, "--provider",
             f"fake:///{self.provider}{self.provider_options}", "--server", self.server,
             "--id", f"w{n}", "--timeout", f"{TIMEOUT_S:g}"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._errors[n], text=True)
            for n in range(self.workers)]
        self.threads = [threading.Thread(target=self._drive, args=(proc, f"w{n}"), daemon=True)
                        for n, proc in enumerate(self.procs)]
        for thread in self.threads:
            thread.start()

    @staticmethod
    def job(op: str) -> dict[str, Any]:
        return {"op": op, "kind": "email.send", "target": f"mailto:{op}@example.com",
                "payload": {"op": op}}

    def key(self, op: str) -> str:
        return f"agent:{op}:email.send:mailto:{op}@example.com"

    def _next(self) -> str | None:
        """The next job to deliver; None once draining and nothing is left."""
        while True:
            with self._lock:
                if self._pending:
                    op = self._pending.popleft()
                elif not self._draining.is_set() and len(self.ops) < self.limit:
                    op = f"op{len(self.ops)}"
                    self.ops.append(op)
                elif self._draining.is_set() and self._in_flight == 0:
                    return None
                else:
                    op = None
                if op is not None:
                    self._in_flight += 1
                    return op
            time.sleep(0.05)

    def _drive(self, proc: subprocess.Popen[str], name: str) -> None:
        assert proc.stdin is not None and proc.stdout is not None
        while (op := self._next()) is not None:
            line = ""
            try:
                proc.stdin.write(json.dumps(self.job(op)) + "\n")
                proc.stdin.flush()
                line = proc.stdout.readline()  # the test's timeout bounds a hang
            except (OSError, ValueError):  # stopped meanwhile (its pipes closed)
                pass
            with self._lock:
                self._in_flight -= 1
                if not line:
                    self.hung.append(op)
                    return
                body = json.loads(line)
                self.replies.append(Reply(op, name, body, time.monotonic()))
                if body.get("ack"):
                    self._acked.add(op)
                else:
                    self._pending.append(op)
            time.sleep(self.pause_s)

    def drain(self, within_s: float) -> None:
        """Stop taking new jobs; wait until every job was acknowledged once."""
        self._draining.set()
        for thread in self.threads:
            thread.join(within_s)
        assert not any(t.is_alive() for t in self.threads), "jobs still not acknowledged"
        assert not self.hung, f"worker processes ended mid-job: {self.hung} {self.stderr()}"
        assert self._acked == set(self.ops)

    def stop(self) -> str:
        """End the processes; their stderr."""
        self._draining.set()
        for proc in self.procs:
            if proc.stdin is not None:
                with contextlib.suppress(OSError):
                    proc.stdin.close()
        for proc in self.procs:
            try:  # after a broker restart a worker's exit can hang in librdkafka (open issue)
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        return self.stderr()

    def stderr(self) -> str:
        """What the worker processes wrote to stderr so far."""
        out = []
        for errors in self._errors:
            errors.seek(0)
            out.append(errors.read())
        return "".join(out)

    def acknowledged_events(self) -> set[str]:
        return {e for r in self.replies for e in r.body.get("events", ())}


def logged_event_ids(log_url: str) -> set[str]:
    """Every event id in the events topic (read to its end)."""
    codec = event_codec()
    found: set[str] = set()
    with open_log(log_url, create=False) as log:
        for partition, end in log.end_offsets(EVENTS).items():
            offset = 0
            while offset < end:
                records = log.read(EVENTS, partition, offset, 1000)
                if not records:
                    break
                for record in records:
                    with contextlib.suppress(CodecError):  # counted by the projector
                        found.add(str(codec.decode(record.value)["event_id"]))
                offset = records[-1].offset + 1
    return found


def lag_is_zero(serve: Serve, partitions: int) -> bool:
    """``serve`` answers /healthz healthy, serving every partition, each applied to its end."""
    status, body = answer(serve.url + "/healthz")
    return status == 200 and body.get("projector_lag") == 0 and \
        len(serve.serving()) == partitions


def equals_clean_rebuild(log_url: str, state_dir: Path, clean: Path) -> None:
    """Each partition of ``state_dir`` digests as a full replay of the log (its states,
    index and counters: a partition restored from the changelog keeps no rejection records
    from before the checkpoint it restored)."""
    with open_log(log_url, create=False) as log, \
            Projector(log, clean, from_changelog=False) as projector:
        partitions = log.partitions(EVENTS)
        projector.run(once=True)
    for partition in range(partitions):
        assert partition_digest(state_dir, partition, RESTORED) == \
            partition_digest(clean, partition, RESTORED), \
            f"partition {partition} differs from a clean rebuild"
