"""The soak: a seeded agent workload under SIGKILLs, then recovery until quiet, then checks.

It reuses the demo's engine (``effectlog.cli.demo``): the seeded workload with its crash
points and provider faults, the at-least-once job queue whose worker processes kill
themselves at transition boundaries, and the demo's settler. Beside the workers run real
``effectlog serve`` processes (projector, recovery and reconciler), each SIGKILLed at seeded
random moments and restarted: one on SQLite; on Kafka (``bench/soak_kafka.py``) several
sharing the partitions, which the workers read state through, while the soak's own Apache
Kafka broker is SIGKILLed and restarted too (with ``--brokers 3``, a KRaft cluster of three
whose partition leaders are SIGKILLed in turn). When every job is acknowledged, the faults stop
and recovery runs until quiet (nothing RESERVED, DISPATCHED or UNKNOWN is left).

Checked at the end, from sources independent of effectlog's own bookkeeping:

- duplicate effects: the fake provider's per-key execution counters (it performs every
  call it receives, as an email or payment API would);
- lost acknowledged events: every event id whose append returned to a worker that lived
  to reply must be in the log, and every job a worker reported settled (succeeded or
  failed) must be settled the same way in the final projection;
- the final projection, killed and resumed many times, digests equal to a clean rebuild
  (on Kafka so does every other instance's copy, caught up from its stored offsets).

Usage: python bench/soak.py [--ops N] [--workers N] [--log sqlite|kafka] [--brokers 1|3]
[--broker-every A-B] [--broker-kills N] [--fence-after S] [--seed N] [--dir DIR]
(without --dir it works in a fresh temporary directory, removed when every check passed)

The last line reads ``soak: OPS operations, KILLS kills, DUP duplicate effects, LOST lost
acknowledged events; the final projection equals a clean rebuild`` (or ``DIFFERS from``);
the exit status is 0 only when DUP and LOST are 0, the projections are equal, recovery
went quiet, no ``serve`` crashed (exited by itself, except with status 4 at a start while
the broker was down) and every ``serve`` instance served in at least one of its starts (its
``/healthz`` listed a serving partition; stderr gives starts and starts that served per
instance, and one line for an instance that never served); 1 otherwise, 2 bad usage, 4 no
broker could be started.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import _common  # noqa: F401 - puts the repository on sys.path
from soak_drivers import ServeUnderFire

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
from tools.kafka.broker import BrokerError, free_port

STUCK_AFTER_S = 1.5  # as the demo on SQLite: slow answers (2.5-3.5 s) get taken over


@dataclass
class Acknowledged:
    """What workers that lived to reply were told was durable."""

    events: set[str] = field(default_factory=set)
    settled: dict[str, str] = field(default_factory=dict)  # key -> succeeded | failed
    errors: Counter[str] = field(default_factory=Counter)  # deliveries the log refused

    def add(self, job: Job, reply: dict[str, Any]) -> None:
        self.events.update(reply.get("events", ()))
        if reply.get("status") == "error":
            self.errors[str(reply.get("detail"))[:120]] += 1
        if reply.get("status") in ("succeeded", "failed"):
            self.settled[job.key] = str(reply["status"])


class Arrangement(Protocol):
    """Where the soak's log lives and what it kills besides the workers."""

    log_url: str
    settle_state: Path  # recovery until quiet runs here: the final projection
    stuck_after_s: float

    def start(self) -> None: ...
    def worker_args(self) -> list[str]: ...
    def kills(self) -> dict[str, int]: ...
    def stop_faults(self) -> None: ...
    def caught_up_states(self) -> list[Path]: ...
    def crashes(self) -> int: ...
    def instances(self) -> list[ServeUnderFire]: ...
    def notes(self) -> list[str]: ...
    def close(self) -> None: ...


class SqliteArrangement:
    """A SQLite log and one ``effectlog serve`` under fire on its state directory."""

    stuck_after_s = STUCK_AFTER_S

    def __init__(self, work: Path, provider_spec: str, seed: int, env: dict[str, str], *,
                 serve_uptime_s: tuple[float, float]) -> None:
        self.log_url, self.settle_state = f"sqlite:///{work}/log.db", work / "state"
        open_log(self.log_url).close()
        port = free_port()
        self.serve = ServeUnderFire(
            ["--log", self.log_url, "--state", str(self.settle_state), "serve", "--provider",
             provider_spec, "--http", f"127.0.0.1:{port}", "--poll", "250ms",
             "--stuck-after", f"{STUCK_AFTER_S * 1000:.0f}ms", "--command-timeout", "3s"],
            f"http://127.0.0.1:{port}", work / "serve.log", env, random.Random(seed),
            serve_uptime_s)

    def start(self) -> None:
        self.serve.start()

    def worker_args(self) -> list[str]:
        return []

    def kills(self) -> dict[str, int]:
        return {"serve": self.serve.kills}

    def stop_faults(self) -> None:
        self.serve.stop()

    def caught_up_states(self) -> list[Path]:
        return []

    def crashes(self) -> int:
        return self.serve.crashes

    def instances(self) -> list[ServeUnderFire]:
        return [self.serve]

    def notes(self) -> list[str]:
        return []

    def close(self) -> None:
        pass


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


def projections_equal(log_url: str, arrangement: Arrangement, work: Path) -> bool:
    """The final projection, and every other copy caught up from its stored offsets, digest
    equal to a clean rebuild of the whole log."""
    project(open_log(log_url, create=False), work / "clean")
    clean = projection_digest(work / "clean")
    equal = projection_digest(arrangement.settle_state) == clean
    for state in arrangement.caught_up_states():
        project(open_log(log_url, create=False), state)
        same = projection_digest(state) == clean
        print(f"soak: {state.name} caught up from its stored offsets: "
              f"{'equals' if same else 'DIFFERS from'} the clean rebuild", file=sys.stderr)
        equal = equal and same
    return equal


def arrange(args: argparse.Namespace, work: Path, spec: str, env: dict[str, str]) -> Arrangement:
    # a start on a loaded 2-core machine takes seconds: each start gets the time to serve
    serve_uptime = _span(args.serve_uptime or ("3-6" if args.log == "sqlite" else "8-20"))
    if args.log == "sqlite":
        return SqliteArrangement(work, spec, args.seed, env, serve_uptime_s=serve_uptime)
    from soak_kafka import KafkaArrangement

    every = args.broker_every or ("40-80" if args.brokers == 1 else "20-40")
    return KafkaArrangement(work, spec, args.seed, env, serves=args.serves,
                            serve_uptime_s=serve_uptime, broker_every_s=_span(every),
                            broker_kills=args.broker_kills, brokers=args.brokers,
                            fence_after_s=args.fence_after)


def _span(text: str) -> tuple[float, float]:
    low, high = (float(x) for x in text.split("-"))
    return low, high


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=int(os.environ.get("OPS", "1000")))
    parser.add_argument("--workers", type=int, default=int(os.environ.get("WORKERS", "4")))
    parser.add_argument("--log", default=os.environ.get("LOG", "sqlite"),
                        choices=["sqlite", "kafka"])
    parser.add_argument("--seed", type=int, default=int(os.environ.get("SEED", "7")))
    parser.add_argument("--crash-rate", type=float, default=0.1)
    parser.add_argument("--serve-uptime", default=None, metavar="A-B",
                        help="seconds a serve instance lives before its SIGKILL "
                             "(default 3-6 on SQLite, 8-20 on Kafka)")
    parser.add_argument("--serves", type=int, default=2,
                        help="serve instances on Kafka (each with its own state directory)")
    parser.add_argument("--brokers", type=int, default=int(os.environ.get("BROKERS") or 1),
                        help="Kafka nodes: 1, or a KRaft cluster of 3 or more whose partition "
                             "leaders are SIGKILLed")
    parser.add_argument("--broker-every", default=None, metavar="A-B",
                        help="seconds between SIGKILLs of the Kafka broker (default 40-80), or "
                             "of a partition leader on a cluster (default 20-40)")
    parser.add_argument("--broker-kills", type=int, default=None, metavar="N",
                        help="stop killing brokers (or leaders) after N kills (default: no "
                             "limit); sizes a short soak whose broker restarts dominate it")
    parser.add_argument("--fence-after", type=float, default=None, metavar="S",
                        help="seconds the Kafka controller waits for a silent node's heartbeat "
                             "before fencing it (broker.session.timeout.ms; Kafka's default 9); "
                             "a lower value moves a killed leader's partitions sooner")
    parser.add_argument("--dir", default=None, help="work directory (default: a fresh temp dir)")
    args = parser.parse_args()
    if args.fence_after is not None and not 1 <= args.fence_after <= 60:
        parser.error(f"--fence-after is 1 to 60 seconds, not {args.fence_after:g}")
    if args.broker_kills is not None and args.broker_kills < 1:
        parser.error(f"--broker-kills is 1 or more, not {args.broker_kills}")
    if args.brokers < 1 or args.brokers == 2:
        parser.error(f"--brokers is 1 or a cluster of 3 or more, not {args.brokers}")
    own_dir = args.dir is None
    work = Path(args.dir or tempfile.mkdtemp(prefix="effectlog-soak-")).absolute()
    work.mkdir(parents=True, exist_ok=True)
    if any(work.iterdir()):
        print(f"soak: {work} is not empty; give a fresh --dir", file=sys.stderr)
        return 2
    jobs = generate(WorkloadSettings(operations=args.ops, crash_rate=args.crash_rate,
                                     seed=args.seed))
    provider = FakeProvider(work / "provider.db", dedupe=False)
    for job in jobs:
        if job.lookup_outage:
            provider.inject_lookup_outage(job.lookup_outage, key=job.key)
    spec = f"fake://{work / 'provider.db'}?dedupe=0"
    # A killed process may leave a projection reader's scratch directory in TMPDIR.
    (work / "tmp").mkdir()
    env = {**os.environ, "TMPDIR": str(work / "tmp")}
    started = time.monotonic()
    print(f"soak: {args.ops} operations, {args.workers} workers, seed {args.seed}, "
          f"{args.log}, in {work}", file=sys.stderr)
    try:
        arrangement = arrange(args, work, spec, env)
    except BrokerError as exc:
        print(f"soak: Apache Kafka could not start: {exc}", file=sys.stderr)
        return 4
    try:
        return _soak(args, work, jobs, provider, spec, env, arrangement, started, own_dir)
    finally:
        arrangement.close()
        provider.close()


def _soak(args: argparse.Namespace, work: Path, jobs: list[Job], provider: FakeProvider,
          spec: str, env: dict[str, str], arrangement: Arrangement, started: float,
          own_dir: bool) -> int:
    log_url = arrangement.log_url
    acknowledged = Acknowledged()
    last = [0.0]

    def progress(stats: QueueStats) -> None:
        if time.monotonic() - last[0] >= 10:
            last[0] = time.monotonic()
            kills = ", ".join(f"{n} {what} kills" for what, n in arrangement.kills().items())
            print(f"soak: {stats.done}/{stats.jobs} jobs, {stats.crashes} worker kills, "
                  f"{kills}", file=sys.stderr)

    def command(name: str) -> list[str]:
        return [sys.executable, "-m", "effectlog.cli.demo.worker_main", "--log", log_url,
                "--state", str(work / "worker-state"), "--provider", spec, "--id", name,
                *arrangement.worker_args()]

    arrangement.start()
    try:
        with (work / "workers.log").open("ab") as stderr:
            stats = WorkerPool(jobs, args.workers, command, stderr, progress, env=env,
                               on_reply=acknowledged.add).run()
    finally:
        arrangement.stop_faults()
    for detail, n in acknowledged.errors.most_common(5):
        print(f"soak: {n} deliveries answered: {detail}", file=sys.stderr)
    print(f"soak: workload done in {time.monotonic() - started:.0f}s "
          f"({stats.dead_lettered} dead-lettered); recovery until quiet", file=sys.stderr)
    settler = Settler(log_url, arrangement.settle_state, provider,
                      stuck_after_s=arrangement.stuck_after_s).start()
    try:
        quiet = settler.settle(within_s=300)
        stuck = settler.stuck()
    finally:
        settler.close()

    duplicates = provider_figures(work / "provider.db").duplicates
    lost = len(acknowledged.events - logged_event_ids(log_url))
    lost += settled_differently(arrangement.settle_state, acknowledged.settled)
    equal = projections_equal(log_url, arrangement, work)
    others = arrangement.kills()
    kills = stats.crashes + sum(others.values())
    crashes = arrangement.crashes()
    print(f"soak: {stats.crashes} worker kills, "
          + "".join(f"{n} {what} kills, " for what, n in others.items())
          + "".join(f"{note}, " for note in arrangement.notes())
          + f"{crashes} serve crashes, {stats.dead_lettered} jobs "
          f"dead-lettered, {len(acknowledged.events)} acknowledged events checked, "
          f"recovery {'quiet' if quiet else f'NOT quiet ({stuck} stuck)'}, "
          f"{time.monotonic() - started:.0f}s", file=sys.stderr)
    never = []
    for serve in arrangement.instances():
        ready = (f" (serving {statistics.median(serve.ready_s):.1f}s after a start, median)"
                 if serve.ready_s else "")
        print(f"soak: {serve.name} started {serve.starts} times, served in {serve.served}"
              f"{ready}", file=sys.stderr)
        if serve.served == 0:
            never.append(serve.name)
    for name in never:
        print(f"soak: {name} never served: none of its starts held a serving partition "
              "before it ended", file=sys.stderr)
    verdict = "equals" if equal else "DIFFERS from"
    print(f"soak: {args.ops} operations, {kills} kills, {duplicates} duplicate effects, "
          f"{lost} lost acknowledged events; the final projection {verdict} a clean rebuild")
    passed = duplicates == 0 and lost == 0 and equal and quiet and crashes == 0 and not never
    if passed and own_dir:
        shutil.rmtree(work, ignore_errors=True)  # kept when something is wrong, to look at
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
