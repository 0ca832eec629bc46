"""The soak: a seeded agent workload under SIGKILLs, then recovery until quiet, then checks.

It reuses the demo's engine (``effectlog.cli.demo``): the seeded workload with its crash
points and provider faults, the at-least-once job queue whose worker processes kill
themselves at transition boundaries, and the demo's settler. Beside the workers runs a real
``effectlog serve`` process (projector, recovery and reconciler) that is itself SIGKILLed
at seeded random moments and restarted. When every job is acknowledged, ``serve`` is
stopped and recovery runs until quiet (nothing RESERVED, DISPATCHED or UNKNOWN is left).

Checked at the end, from sources independent of effectlog's own bookkeeping:

- duplicate effects: the fake provider's per-key execution counters (it performs every
  call it receives, as an email or payment API would);
- lost acknowledged events: every event id whose append returned to a worker that lived
  to reply must be in the log, and every job a worker reported settled (succeeded or
  failed) must be settled the same way in the final projection;
- the final projection, killed and resumed many times, digests equal to a clean rebuild.

Usage: python bench/soak.py [--ops N] [--workers N] [--log sqlite] [--seed N] [--dir DIR]
(without --dir it works in a fresh temporary directory, removed when every check passed)

The last line reads ``soak: OPS operations, KILLS kills, DUP duplicate effects, LOST lost
acknowledged events; the final projection equals a clean rebuild`` (or ``DIFFERS from``);
the exit status is 0 only when DUP and LOST are 0 and the projections are equal.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _common  # noqa: F401 - puts the repository on sys.path

from consumers.providers.fake import FakeProvider
from effectlog.cli.demo.pool import QueueStats, WorkerPool
from effectlog.cli.demo.report import provider_figures
from effectlog.cli.demo.settle import Settler
from effectlog.cli.demo.workload import Job, WorkloadSettings, generate
from effectlog.codec import event_codec
from effectlog.errors import CodecError
from effectlog.log import EVENTS, open_log
from effectlog.model import State
from projections import open_reader
from projections.projector import project
from projections.rocksdb.digest import projection_digest

EFFECTLOG = Path(sys.executable).with_name("effectlog")
STUCK_AFTER = "1500ms"  # as the demo on SQLite: slow answers (2.5-3.5 s) get taken over


@dataclass
class Acknowledged:
    """What workers that lived to reply were told was durable."""

    events: set[str] = field(default_factory=set)
    settled: dict[str, str] = field(default_factory=dict)  # key -> succeeded | failed

    def add(self, job: Job, reply: dict[str, Any]) -> None:
        self.events.update(reply.get("events", ()))
        if reply.get("status") in ("succeeded", "failed"):
            self.settled[job.key] = str(reply["status"])


class ServeUnderFire:
    """One ``effectlog serve`` process, SIGKILLed after a seeded random uptime and started
    again, until :meth:`stop` ends it with SIGTERM."""

    def __init__(self, log_url: str, state: Path, provider_spec: str, work: Path,
                 rng: random.Random, uptime_s: tuple[float, float]) -> None:
        self.args = [str(EFFECTLOG), "--log", log_url, "--state", str(state), "serve",
                     "--provider", provider_spec, "--metrics-port", "0", "--poll", "250ms",
                     "--stuck-after", STUCK_AFTER, "--command-timeout", "3s"]
        self.work = work
        self.rng = rng
        self.uptime_s = uptime_s
        self.kills = 0
        self._stop = threading.Event()
        self._proc: subprocess.Popen[bytes] | None = None
        self._thread = threading.Thread(target=self._run, name="serve-killer", daemon=True)
        # Secondary readers keep scratch directories in TMPDIR; a killed serve leaves its own.
        self._env = {**os.environ, "TMPDIR": str(work / "tmp")}
        (work / "tmp").mkdir(exist_ok=True)

    def start(self) -> ServeUnderFire:
        self._thread.start()
        return self

    def _spawn(self) -> subprocess.Popen[bytes]:
        with (self.work / "serve.log").open("ab") as err:
            return subprocess.Popen(self.args, stdout=subprocess.DEVNULL, stderr=err,
                                    env=self._env)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._proc = self._spawn()
            if self._stop.wait(self.rng.uniform(*self.uptime_s)):
                return
            self._proc.send_signal(signal.SIGKILL)
            self._proc.wait()
            self.kills += 1

    def stop(self) -> None:
        """SIGTERM the current instance and wait for it (SIGKILL after 60 s)."""
        self._stop.set()
        self._thread.join(30)
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def logged_event_ids(log_url: str) -> set[str]:
    log = open_log(log_url, create=False)
    codec = event_codec()
    found = set()
    try:
        for partition in range(log.partitions(EVENTS)):
            for record in log.scan(EVENTS, partition):
                try:
                    found.add(str(codec.decode(record.value)["event_id"]))
                except (CodecError, KeyError):
                    continue
    finally:
        log.close()
    return found


def settled_differently(state: Path, settled: dict[str, str]) -> int:
    """Jobs a worker reported settled that the final projection does not show so."""
    reader = open_reader(state)
    try:
        wrong = 0
        for key, status in settled.items():
            snapshot = reader.get(key)
            if snapshot is None or snapshot.state is not State(status.upper()):
                wrong += 1
        return wrong
    finally:
        reader.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=int(os.environ.get("OPS", "1000")))
    parser.add_argument("--workers", type=int, default=int(os.environ.get("WORKERS", "4")))
    parser.add_argument("--log", default=os.environ.get("LOG", "sqlite"), choices=["sqlite", "kafka"])
    parser.add_argument("--seed", type=int, default=int(os.environ.get("SEED", "7")))
    parser.add_argument("--crash-rate", type=float, default=0.1)
    parser.add_argument("--serve-uptime", default="1.5-4", metavar="A-B",
                        help="seconds a serve instance lives before its SIGKILL")
    parser.add_argument("--dir", default=None, help="work directory (default: a fresh temp dir)")
    args = parser.parse_args()
    if args.log != "sqlite":
        print("soak: LOG=kafka needs the Apache Kafka launcher; only LOG=sqlite runs so far",
              file=sys.stderr)
        return 2
    own_dir = args.dir is None
    work = Path(args.dir or tempfile.mkdtemp(prefix="effectlog-soak-")).absolute()
    work.mkdir(parents=True, exist_ok=True)
    if any(work.iterdir()):
        print(f"soak: {work} is not empty; give a fresh --dir", file=sys.stderr)
        return 2
    low, high = (float(x) for x in args.serve_uptime.split("-"))
    log_url, state = f"sqlite:///{work}/log.db", work / "state"
    open_log(log_url).close()
    jobs = generate(WorkloadSettings(operations=args.ops, crash_rate=args.crash_rate,
                                     seed=args.seed))
    provider = FakeProvider(work / "provider.db", dedupe=False)
    for job in jobs:
        if job.lookup_outage:
            provider.inject_lookup_outage(job.lookup_outage, key=job.key)
    spec = f"fake://{work / 'provider.db'}?dedupe=0"
    started = time.monotonic()
    print(f"soak: {args.ops} operations, {args.workers} workers, seed {args.seed}, in {work}",
          file=sys.stderr)

    serve = ServeUnderFire(log_url, state, spec, work, random.Random(args.seed), (low, high))
    acknowledged = Acknowledged()
    last = [0.0]

    def progress(stats: QueueStats) -> None:
        if time.monotonic() - last[0] >= 10:
            last[0] = time.monotonic()
            print(f"soak: {stats.done}/{stats.jobs} jobs, {stats.crashes} worker kills, "
                  f"{serve.kills} serve kills", file=sys.stderr)

    def command(name: str) -> list[str]:
        return [sys.executable, "-m", "effectlog.cli.demo.worker_main", "--log", log_url,
                "--state", str(state), "--provider", spec, "--id", name]

    serve.start()
    try:
        with (work / "workers.log").open("ab") as stderr:
            stats = WorkerPool(jobs, args.workers, command, stderr, progress,
                               on_reply=acknowledged.add).run()
    finally:
        serve.stop()
    print(f"soak: workload done in {time.monotonic() - started:.0f}s; recovery until quiet",
          file=sys.stderr)
    settler = Settler(log_url, state, provider).start()
    try:
        quiet = settler.settle(within_s=300)
        stuck = settler.stuck()
    finally:
        settler.close()
        provider.close()

    duplicates = provider_figures(work / "provider.db").duplicates
    lost = len(acknowledged.events - logged_event_ids(log_url))
    lost += settled_differently(state, acknowledged.settled)
    project(open_log(log_url, create=False), work / "clean")
    equal = projection_digest(state) == projection_digest(work / "clean")
    kills = stats.crashes + serve.kills
    print(f"soak: {stats.crashes} worker kills, {serve.kills} serve kills, "
          f"{len(acknowledged.events)} acknowledged events checked, recovery "
          f"{'quiet' if quiet else f'NOT quiet ({stuck} stuck)'}, "
          f"{time.monotonic() - started:.0f}s", file=sys.stderr)
    verdict = "equals" if equal else "DIFFERS from"
    print(f"soak: {args.ops} operations, {kills} kills, {duplicates} duplicate effects, "
          f"{lost} lost acknowledged events; the final projection {verdict} a clean rebuild")
    passed = duplicates == 0 and lost == 0 and equal and quiet
    if passed and own_dir:
        shutil.rmtree(work, ignore_errors=True)  # kept when something is wrong, to look at
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
