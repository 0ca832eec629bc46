"""What the crash tests share: real worker processes, one log + provider per scenario, and
recovery (projector -> recovery consumer -> reconciler) run in-process or through the CLI."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from consumers.bookkeeping import CommandLedger, OffsetStore, consumer_db_path
from consumers.policy import ApprovalPolicy
from consumers.providers.fake import FakeProvider
from consumers.reconciler import Handled, Reconciler, ReconcilerSettings
from consumers.recovery import RecoveryConsumer, RecoverySettings
from consumers.table import Action
from effectlog.judge.client import ClusterJudge
from effectlog.keys import make_key
from effectlog.log import open_log
from effectlog.log.base import EventLog
from effectlog.model import EffectEvent, now_ms
from effectlog.view import LogView, decode_events
from projections import open_reader
from projections.projector import project

REPO = Path(__file__).resolve().parents[2]
STEP_TIMEOUT_S = 60.0  # a paused or finishing worker; generous for a loaded 2-core box
QUIET = frozenset({Action.WAIT, Action.SKIP})


@dataclass(frozen=True)
class Job:
    """One logical operation as a job queue delivers it."""

    op: str
    kind: str = "email.send"
    target: str = "mailto:ops@example.com"
    payload: Any = field(default_factory=lambda: {"subject": "invoice", "amount": 42})

    @property
    def key(self) -> str:
        return make_key(self.op, self.kind, self.target)

    def with_payload(self, payload: Any) -> Job:
        return Job(self.op, self.kind, self.target, payload)


class WorkerProcess:
    """``tests.crash.worker_main`` in its own process; stdout JSON lines read by a thread."""

    def __init__(self, env: Env, job: Job, worker_id: str, pause_at: str | None = None) -> None:
        cmd = [sys.executable, "-m", "tests.crash.worker_main", "--log", env.log_url,
               "--provider", env.provider_spec, "--op", job.op, "--kind", job.kind,
               "--target", job.target, "--payload", json.dumps(job.payload),
               "--worker-id", worker_id, "--accept-timeout", str(env.accept_timeout_s),
               *(("--server", env.server) if env.server else ())]
        if pause_at:
            cmd += ["--pause-at", pause_at]
        self.worker_id = worker_id
        self._stderr = (env.tmp / f"{worker_id}.err").open("w")
        self.proc = subprocess.Popen(cmd, cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self._stderr, text=True,
                                     env={**os.environ, "PYTHONPATH": str(REPO)})
        self._lines: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._done: dict[str, Any] | None = None
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(json.loads(line))
        self._lines.put(None)

    def _next(self) -> dict[str, Any] | None:
        try:
            return self._lines.get(timeout=STEP_TIMEOUT_S)
        except queue.Empty:
            raise AssertionError(f"{self.worker_id} said nothing in {STEP_TIMEOUT_S}s: "
                                 f"{self.stderr()}") from None

    def stderr(self) -> str:
        self._stderr.flush()
        return Path(self._stderr.name).read_text()[-3000:]

    def wait_paused(self, point: str) -> dict[str, Any]:
        """Block until the worker announces it is paused at ``point``."""
        line = self.wait_line()
        assert line is not None and line.get("event") == "paused", \
            f"{self.worker_id} did not pause at {point}: {line} {self.stderr()}"
        assert line["point"] == point
        return line

    def wait_line(self) -> dict[str, Any] | None:
        """The worker's next line (``paused`` or ``done``); None once its output ended."""
        line = self._next()
        if line is not None and line.get("event") == "done":
            self._done = line
        return line

    def kill(self) -> None:
        """SIGKILL, as a crash: no cleanup, no last write."""
        self.proc.send_signal(signal.SIGKILL)
        assert self.proc.wait(STEP_TIMEOUT_S) == -signal.SIGKILL
        self._stderr.close()

    def freeze(self) -> None:
        """SIGSTOP (a long GC pause, a suspended VM), and wait until the kernel shows it."""
        self.proc.send_signal(signal.SIGSTOP)
        deadline = time.monotonic() + STEP_TIMEOUT_S
        while _proc_state(self.proc.pid) != "T":
            assert time.monotonic() < deadline, f"{self.worker_id} did not stop"
            time.sleep(0.01)

    def thaw(self) -> None:
        """SIGCONT, then release the pause."""
        self.proc.send_signal(signal.SIGCONT)
        self.release()

    def release(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()

    def finish(self) -> tuple[int, dict[str, Any]]:
        """(exit code, the ``done`` line) once the worker has ended."""
        done = self._done
        while (line := self._next()) is not None:
            done = line
        code = self.proc.wait(STEP_TIMEOUT_S)
        self._stderr.close()
        assert done is not None and done.get("event") == "done", \
            f"{self.worker_id} exited {code} without a result: {self.stderr()}"
        return code, done


def _proc_state(pid: int) -> str:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0]


class Env:
    """One scenario's world: an event log, a fake provider file, a projection directory.

    The provider runs with ``dedupe=0``: it performs every call it accepts, so a second
    dispatch of an effect shows up as a second execution instead of being hidden. On a log
    without compare-and-append (Kafka) ``server`` is the judge of every write: the worker
    processes' and the reconciler's.
    """

    def __init__(self, tmp: Path, log_url: str, *, lookup_complete: bool = True,
                 server: str | None = None, accept_timeout_s: float = 30.0) -> None:
        tmp.mkdir(parents=True, exist_ok=True)
        self.tmp = tmp
        self.accept_timeout_s = accept_timeout_s  # the worker processes' wait for a verdict
        self.log_url = log_url
        self.server = server
        self.state_dir = tmp / "state"
        flag = "1" if lookup_complete else "0"
        self.provider_spec = f"fake:///{tmp}/provider.db?dedupe=0&lookup_complete={flag}"
        self.provider = FakeProvider(tmp / "provider.db", dedupe=False,
                                     lookup_complete=lookup_complete)
        self._worker_count = 0

    def worker(self, job: Job, pause_at: str | None = None) -> WorkerProcess:
        self._worker_count += 1
        return WorkerProcess(self, job, f"w{self._worker_count}", pause_at)

    def run(self, job: Job) -> tuple[int, dict[str, Any]]:
        """Deliver ``job`` to a fresh worker process and wait for it."""
        return self.worker(job).finish()

    def crash(self, job: Job, point: str) -> None:
        """Run ``job`` until ``point``, then SIGKILL the worker."""
        proc = self.worker(job, pause_at=point)
        proc.wait_paused(point)
        proc.kill()

    @contextmanager
    def log(self) -> Iterator[EventLog]:
        log = open_log(self.log_url)
        try:
            yield log
        finally:
            log.close()

    def current(self, key: str) -> EffectEvent | None:
        with self.log() as log:
            return LogView(log).current(key)

    def history(self, key: str) -> list[EffectEvent]:
        with self.log() as log:
            return decode_events(log, key)

    def settle_pass(self, policy: ApprovalPolicy | None = None) -> list[Handled]:
        """Project, issue commands for every stuck effect (no deadline, no backoff), and let
        the reconciler handle them."""
        with self.log() as log:
            project(log, self.state_dir)
            reader = open_reader(self.state_dir)
            ledger = CommandLedger(consumer_db_path(self.state_dir, "recovery"))
            settings = RecoverySettings(stuck_after_s=0, command_timeout_s=0, backoff_base_s=0,
                                        backoff_cap_s=0)
            try:
                RecoveryConsumer(log, reader, ledger, settings,
                                 clock=lambda: now_ms() + 1000).run_once()
            finally:
                ledger.close()
                reader.close()
            offsets = OffsetStore(consumer_db_path(self.state_dir, "reconciler"))
            judge = ClusterJudge(self.server, wait_s=30) if self.server else None
            reconciler = Reconciler(log, self.provider, offsets, ReconcilerSettings(
                worker_id="reconciler-1", policy=policy or ApprovalPolicy()), judge=judge)
            try:
                return reconciler.run_once()
            finally:
                offsets.close()
                if judge is not None:
                    judge.close()

    def settle(self, policy: ApprovalPolicy | None = None, max_passes: int = 6) -> list[Handled]:
        """Passes until one appends nothing; every action taken, in order."""
        done: list[Handled] = []
        for _ in range(max_passes):
            handled = self.settle_pass(policy)
            done += handled
            if all(h.action in QUIET for h in handled):
                return done
        raise AssertionError(f"recovery did not settle in {max_passes} passes: {done}")

    def cli(self, *args: str, log_url: str | None = None) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "effectlog.cli.main", "--log", log_url or self.log_url,
               "--state", str(self.state_dir), *args]
        # recover reads this test's own projection (EFFECTLOG_SERVER would ask the cluster)
        judged = {"EFFECTLOG_SERVER": self.server} if self.server and args[0] != "recover" \
            else {}
        return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True,
                              timeout=STEP_TIMEOUT_S * 2, env={**os.environ, **judged})

    def settle_cli(self) -> list[dict[str, Any]]:
        """One pass through the real commands: project, recover and reconcile ``--once``."""
        for args in (("project", "--once", "--quiet"),
                     ("recover", "--once", "--stuck-after", "0s", "--command-timeout", "0s"),
                     ("reconcile", "--once", "--json", "--provider", self.provider_spec)):
            done = self.cli(*args)
            assert done.returncode == 0, f"{args[0]} exited {done.returncode}: {done.stderr}"
        return [json.loads(line) for line in done.stdout.splitlines() if line.strip()]


def actions(handled: list[Handled], key: str) -> list[Action]:
    return [h.action for h in handled if h.key == key]


def provider_result(env: Env, key: str) -> Any:
    """What the provider stored for ``key`` (its receipt), by lookup."""
    found = env.provider.lookup(key)
    assert found.outcome is not None, f"the provider has no result for {key}: {found}"
    return found.outcome.result
