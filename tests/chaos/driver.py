"""The chaos run: three ``serve`` members, six worker processes of four threads, 40 keys.

While workers perform effects on a sliding window of shared keys (fresh keys, and replays of
finished ones), the driver SIGKILLs and restarts serve members, has a fourth member join and
leave, stops a member to rebuild its projection and starts it again, SIGKILLs worker
processes (a replacement starts at once) and SIGSTOPs others for a few seconds. Serve's own
recovery and reconciler run too (effects left DISPATCHED by a killed worker are settled by
lookup or re-dispatched). The provider is the fake with ``dedupe=0``: it performs and counts
every call it receives. The promise checked at the end: no key received two calls, and every
key that received one has an accepted DISPATCH in a clean replay of the log.

    python -m tests.chaos.driver --seconds 60 [--seed N] [--bootstrap HOST:PORT]

The last line: performs, provider calls, kills, rebalances, rebuilds, duplicate keys.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from effectlog.log import open_log
from effectlog.log.kafka import KafkaSettings, create_topics
from effectlog.machine import fold
from effectlog.model import Transition
from effectlog.view import decode_events
from tests.cluster_support import Serve, wait_until

REPO = Path(__file__).resolve().parents[2]
PARTITIONS = 6
STUCK_AFTER = "20s"  # longer than any pause: recovery never acts on a worker still calling
MAX_PAUSE_S = 3.0


@dataclass
class Report:
    """What a chaos run did and found."""

    seconds: float = 0.0
    performs: Counter[str] = field(default_factory=Counter)
    kills: int = 0
    rebalances: int = 0
    rebuilds: int = 0
    pauses: int = 0
    calls: int = 0
    duplicates: dict[str, int] = field(default_factory=dict)
    unjudged: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.duplicates and not self.unjudged

    def outcomes(self) -> str:
        """How the performs ended, most frequent first."""
        return ", ".join(f"{n} {outcome}" for outcome, n in self.performs.most_common())

    def last_line(self) -> str:
        return (f"chaos: {sum(self.performs.values())} performs ({self.calls} provider calls, "
                f"{self.performs['replayed']} replays) in {self.seconds:.0f}s; {self.kills} kills, "
                f"{self.pauses} pauses, {self.rebalances} rebalances, {self.rebuilds} rebuilds; "
                f"{len(self.duplicates)} duplicate keys, {len(self.unjudged)} calls without an "
                "accepted DISPATCH")


class WorkerProcess:
    """One chaos worker process; its output lines are counted as they come."""

    def __init__(self, url: str, servers: str, provider: str, name: str, seed: int,
                 report: Report, lock: threading.Lock, err: IO[str]) -> None:
        self.name = name
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.chaos.worker_main", "--log", url, "--servers", servers,
             "--provider", provider, "--id", name, "--seed", str(seed)],
            cwd=REPO, stdout=subprocess.PIPE, stderr=err, text=True,
            env={**os.environ, "PYTHONPATH": str(REPO)})
        self._reader = threading.Thread(target=self._count, args=(report, lock), daemon=True)
        self._reader.start()

    def _count(self, report: Report, lock: threading.Lock) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            try:
                outcome = json.loads(line)["outcome"]
            except (ValueError, KeyError):
                continue
            with lock:
                report.performs[outcome.split(":", 1)[0] if outcome.startswith("called:")
                                else outcome] += 1

    def signal(self, number: int) -> None:
        if self.process.poll() is None:
            self.process.send_signal(number)

    def stop(self, grace_s: float = 3.0) -> None:
        """SIGTERM; SIGKILL after ``grace_s`` (a thread may be waiting on the judge)."""
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGTERM)
        try:
            self.process.wait(grace_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
        self._reader.join(10)


class Chaos:
    """One run's processes and what happened to them."""

    def __init__(self, bootstrap: str, tmp: Path, seed: int) -> None:
        self.rng = random.Random(seed)
        self.tmp = tmp
        self.url = f"kafka://{bootstrap}?prefix=chaos{uuid.uuid4().hex[:8]}&partitions={PARTITIONS}"
        create_topics(KafkaSettings.from_url(self.url))
        self.provider_path = tmp / "provider.db"
        self.provider = f"fake:///{self.provider_path}?dedupe=0"
        self.report = Report()
        self.lock = threading.Lock()
        self.err = (tmp / "workers.err").open("w")
        self.members = [self._serve(f"s{i}") for i in range(3)]
        self.servers = ",".join(m.url for m in self.members)
        self.extra: Serve | None = None
        self.restarts = 0
        self.workers: list[WorkerProcess] = []

    def _serve(self, name: str, state_dir: Path | None = None) -> Serve:
        return Serve(self.tmp, name, self.url, None, state_dir, "--stuck-after", STUCK_AFTER,
                     "--provider", self.provider)

    def start(self, workers: int) -> None:
        wait_until(lambda: sum(len(m.serving()) for m in self.members) == PARTITIONS, 120,
                   "the members serve every partition")
        self.workers = [self._worker(n) for n in range(workers)]

    def _worker(self, n: int) -> WorkerProcess:
        self.restarts += 1
        return WorkerProcess(self.url, self.servers, self.provider, f"w{n}-{self.restarts}",
                             self.restarts, self.report, self.lock, self.err)

    # -- what happens ----------------------------------------------------------------------

    def kill_member(self) -> None:
        i = self.rng.randrange(len(self.members))
        member = self.members[i]
        member.kill()
        self.report.kills += 1
        time.sleep(self.rng.uniform(0.5, 2.0))
        self.members[i] = self._serve(member.name, member.state_dir)
        self.report.rebalances += 2  # the member leaves (after its session), then rejoins

    def rebuild_member(self) -> None:
        i = self.rng.randrange(len(self.members))
        member = self.members[i]
        member.stop()  # rebuild takes the state directory serve holds: stop it first
        done = subprocess.run([sys.executable, "-m", "effectlog.cli.main", "--log", self.url,
                               "--state", str(member.state_dir), "rebuild", "--quiet"],
                              cwd=REPO, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        self.report.rebuilds += 1
        self.members[i] = self._serve(member.name, member.state_dir)
        self.report.rebalances += 2

    def join_or_leave(self) -> None:
        if self.extra is None:
            self.extra = self._serve("s3")
        else:
            self.extra.stop()
            self.extra = None
        self.report.rebalances += 1

    def kill_worker(self) -> None:
        n = self.rng.randrange(len(self.workers))
        self.workers[n].signal(signal.SIGKILL)
        self.report.kills += 1
        self.workers[n] = self._worker(n)

    def pause_worker(self) -> None:
        worker = self.rng.choice(self.workers)
        worker.signal(signal.SIGSTOP)
        self.report.pauses += 1
        time.sleep(self.rng.uniform(0.5, MAX_PAUSE_S))
        worker.signal(signal.SIGCONT)

    def run(self, seconds: float) -> None:
        start = time.monotonic()
        planned = {0.15: self.join_or_leave, 0.4: self.rebuild_member, 0.65: self.join_or_leave}
        random_acts = (self.kill_member, self.kill_worker, self.kill_worker, self.pause_worker,
                       self.pause_worker)
        while (elapsed := time.monotonic() - start) < seconds:
            due = [at for at in planned if elapsed >= at * seconds]
            if due:
                planned.pop(min(due))()
            else:
                self.rng.choice(random_acts)()
            time.sleep(self.rng.uniform(1.0, 3.0))
        self.report.seconds = time.monotonic() - start

    def finish(self) -> Report:
        for worker in self.workers:
            worker.signal(signal.SIGCONT)
            worker.signal(signal.SIGTERM)
        for worker in self.workers:
            worker.stop()
        members = [*self.members, *([self.extra] if self.extra else [])]
        for member in members:
            if member.process.poll() is None:
                member.process.send_signal(signal.SIGTERM)
        errors = {member.name: member.stop() for member in members}
        self.err.close()
        self._judge_calls()
        for name, err in errors.items():
            assert "Traceback" not in err, f"{name}: {err[-3000:]}"
        return self.report

    def _judge_calls(self) -> None:
        """Provider calls per key, and whether each called key has an accepted DISPATCH."""
        db = sqlite3.connect(self.provider_path)
        try:
            rows = db.execute("SELECT key, calls FROM effects").fetchall()
        finally:
            db.close()
        report = self.report
        report.calls = sum(int(calls) for _, calls in rows)
        report.duplicates = {str(key): int(calls) for key, calls in rows if calls > 1}
        with open_log(self.url) as log:
            for key, _ in rows:
                events = decode_events(log, str(key))
                _, rejected = fold(events)
                refused = {id(e) for e, _ in rejected}
                if not any(e.transition is Transition.DISPATCH and id(e) not in refused
                           for e in events):
                    report.unjudged.append(str(key))


def chaos(bootstrap: str, seconds: float, seed: int = 1, workers: int = 6) -> Report:
    """One chaos run on the broker at ``bootstrap``; its report."""
    with tempfile.TemporaryDirectory(prefix="chaos-") as tmp:
        run = Chaos(bootstrap, Path(tmp), seed)
        try:
            run.start(workers)
            run.run(seconds)
        finally:
            report = run.finish()
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--bootstrap", default=os.environ.get("EFFECTLOG_TEST_KAFKA"))
    args = parser.parse_args()
    if args.bootstrap:
        report = chaos(args.bootstrap, args.seconds, args.seed)
    else:
        from tests.kafka_broker import kafka_bootstrap

        with kafka_bootstrap() as bootstrap:
            report = chaos(bootstrap, args.seconds, args.seed)
    print(f"performs: {report.outcomes()}")
    print(report.last_line())
    sys.exit(0 if report.passed else 1)


if __name__ == "__main__":
    main()
