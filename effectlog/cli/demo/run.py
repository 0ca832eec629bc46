"""One demo run: fresh files, the effectlog run, the naive run, their figures.

Everything the demo writes lives at the log location and beside the state directory
(``<state>``, ``<state>.gen-*``, ``<state>.consumers``, ``<state>.demo``). A marker in
``<state>.demo`` tells files of an earlier demo run apart from anything else; only those
are cleared, anything else makes the demo refuse to start.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from consumers.providers.fake import FakeProvider
from effectlog.cli.demo.pool import QueueStats, WorkerPool
from effectlog.cli.demo.progress import DemoProgress
from effectlog.cli.demo.report import (
    RunFigures,
    effectlog_figures,
    naive_figures,
    provider_figures,
)
from effectlog.cli.demo.settle import RECONCILER_ID, Settler
from effectlog.cli.demo.workload import Job, WorkloadSettings, generate
from effectlog.errors import InvalidInput
from effectlog.log.sqlite_rows import path_from_url

MARKER = "MADE-BY-EFFECTLOG-DEMO"
#: Recovery's deadline while workers run. Slow provider answers (2.5-3.5 s) outlast the
#: SQLite one, so the reconciler takes such effects over and the slow worker is fenced.
SQLITE_STUCK_AFTER_S = 1.5
KAFKA_STUCK_AFTER_S = 15.0


@dataclass(frozen=True, slots=True)
class DemoPaths:
    """Where one demo run keeps its log, projection and provider files."""

    log_url: str
    state_dir: Path
    log_file: Path | None  # the SQLite log file; None on Kafka

    @property
    def work_dir(self) -> Path:
        return self.state_dir.with_name(self.state_dir.name + ".demo")

    def provider_spec(self, name: str) -> str:
        return f"fake://{self.work_dir / name}?dedupe=0"

    def owned(self) -> list[Path]:
        """Every path of a demo run that exists now."""
        state, parent = self.state_dir, self.state_dir.parent
        found = [state, state.with_name(state.name + ".consumers"), self.work_dir,
                 *parent.glob(state.name + ".gen-*"), *parent.glob(state.name + ".new-*")]
        if self.log_file is not None:
            found += [self.log_file.with_name(self.log_file.name + suffix)
                      for suffix in ("", "-wal", "-shm", "-journal")]
        return [p for p in found if p.exists() or p.is_symlink()]


def prepare(log_url: str, state_dir: str) -> tuple[DemoPaths, list[Path]]:
    """Resolve the demo's locations and clear an earlier demo run's files (only those, and
    only of a run on the same kind of log).

    On Kafka the run gets fresh topics (``<prefix>-demo-<time>``). Returns the paths and
    what was removed. Raises :class:`InvalidInput` rather than delete anything else.
    """
    log_file: Path | None = None
    if log_url.startswith("sqlite:"):
        log_file = path_from_url(log_url).absolute()
        log_url, scheme = f"sqlite:///{log_file}", "sqlite"
    elif log_url.startswith("kafka"):
        scheme = "kafka"
    else:
        raise InvalidInput("the demo runs on sqlite:///path or kafka://host:port logs")
    paths = DemoPaths(log_url, Path(state_dir).absolute(), log_file)
    existing = paths.owned()
    if existing and _made_by(paths) not in (scheme, _LEGACY):
        raise InvalidInput(f"{existing[0]} exists and was not made by `effectlog demo` on a "
                           f"{scheme} log: refusing to delete it; give the demo its own "
                           f"{_OWN_LOCATIONS[scheme]}")
    if scheme == "kafka":  # before deleting anything: a broker that is down fails here
        paths = DemoPaths(_fresh_kafka_prefix(log_url), paths.state_dir, None)
    for path in existing:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    paths.work_dir.mkdir(parents=True, mode=0o700)
    (paths.work_dir / MARKER).write_text(f"{scheme}\nfiles of the last `effectlog demo` run on a "
                                         f"{scheme} log; the next such run deletes them\n")
    return paths, existing


_LEGACY = "legacy"  # a marker from before markers named the kind of log
_OWN_LOCATIONS = {
    "sqlite": "--log and --state, e.g. --log sqlite:///.effectlog/demo/log.db "
              "--state .effectlog/demo/state",
    "kafka": "--state, e.g. --log kafka://localhost:9092 --state .effectlog/demo-kafka/state",
}


def _made_by(paths: DemoPaths) -> str | None:
    """The kind of log whose demo run made the files at ``paths``; None if no demo did."""
    try:
        first = (paths.work_dir / MARKER).read_text().split("\n", 1)[0]
    except OSError:
        return None
    return first if first in _OWN_LOCATIONS else _LEGACY


def _fresh_kafka_prefix(url: str) -> str:
    from effectlog.log.kafka import KafkaSettings, create_topics

    prefix = f"{KafkaSettings.from_url(url).prefix}-demo-{int(time.time() * 1000)}"
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != "prefix"]
    fresh = urlunsplit(parts._replace(query=urlencode([*query, ("prefix", prefix)])))
    create_topics(KafkaSettings.from_url(fresh))
    return fresh


@dataclass(frozen=True, slots=True)
class DemoSettings:
    workers: int = 4
    workload: WorkloadSettings = field(default_factory=WorkloadSettings)


@dataclass(frozen=True, slots=True)
class DemoResult:
    effectlog: RunFigures
    naive: RunFigures
    awaiting: list[str]
    settled: bool  # recovery went quiet with nothing stuck but approvals
    reconciler_actions: dict[str, int]  # commands handled, by the action the table chose


def run_demo(paths: DemoPaths, settings: DemoSettings, progress: DemoProgress) -> DemoResult:
    """The effectlog run, then the naive run of the same workload."""
    jobs = generate(settings.workload)
    with (paths.work_dir / "workers.log").open("ab") as stderr:
        effectlog, awaiting, settled, actions = _effectlog_run(paths, settings, jobs, progress,
                                                               stderr)
        naive = _naive_run(paths, settings, jobs, progress, stderr)
    return DemoResult(effectlog, naive, awaiting, settled, actions)


def _effectlog_run(paths: DemoPaths, settings: DemoSettings, jobs: list[Job],
                   progress: DemoProgress,
                   stderr: IO[bytes]) -> tuple[RunFigures, list[str], bool, dict[str, int]]:
    started = time.monotonic()
    provider = FakeProvider(paths.work_dir / "provider.db", dedupe=False)
    for job in jobs:
        if job.lookup_outage:
            provider.inject_lookup_outage(job.lookup_outage, key=job.key)
    spec = paths.provider_spec("provider.db")

    # A live worker must never look stuck: on Kafka each transition waits for the projection.
    on_kafka = paths.log_file is None
    stuck_after_s = KAFKA_STUCK_AFTER_S if on_kafka else SQLITE_STUCK_AFTER_S
    # On Kafka the workers read state through the node's query API, as they would in use.
    settler = Settler(paths.log_url, paths.state_dir, provider, stuck_after_s=stuck_after_s,
                      http=on_kafka).start()

    def command(name: str) -> list[str]:
        return [sys.executable, "-m", "effectlog.cli.demo.worker_main", "--log", paths.log_url,
                "--state", str(paths.state_dir), "--provider", spec, "--id", name,
                *(["--server", settler.url] if on_kafka else [])]

    try:
        name = "effectlog workers"
        progress.phase(name, len(jobs))
        # A killed worker leaves its projection reader's scratch directory behind (Kafka):
        # keep those inside the demo's own directory.
        scratch = paths.work_dir / "tmp"
        scratch.mkdir(exist_ok=True)
        pool = WorkerPool(jobs, settings.workers, command, stderr,
                          lambda s: progress.update(name, s.done, **_status(s, settler)),
                          env={**os.environ, "TMPDIR": str(scratch)})
        stats = pool.run()
        progress.done(name, stats.done, **_status(stats, settler))
        progress.phase("recovery until quiet", 1)
        settled = settler.settle()
        progress.done("recovery until quiet", 1, stuck=settler.stuck(),
                      reconciler_actions=settler.handled)
        figures, awaiting = effectlog_figures(stats, provider_figures(paths.work_dir /
                                                                      "provider.db"),
                                              settler.reader, RECONCILER_ID,
                                              time.monotonic() - started)
        actions = {action.value: n for action, n in sorted(settler.actions.items())}
    finally:
        settler.close()
        provider.close()
    return figures, awaiting, settled, actions


def _naive_run(paths: DemoPaths, settings: DemoSettings, jobs: list[Job], progress: DemoProgress,
               stderr: IO[bytes]) -> RunFigures:
    started = time.monotonic()
    FakeProvider(paths.work_dir / "naive-provider.db", dedupe=False).close()
    spec = paths.provider_spec("naive-provider.db")

    def command(name: str) -> list[str]:
        return [sys.executable, "-m", "effectlog.cli.demo.naive", "--provider", spec, "--id", name]

    name = "naive workers"
    progress.phase(name, len(jobs))
    pool = WorkerPool(jobs, settings.workers, command, stderr,
                      lambda s: progress.update(name, s.done, kills=s.crashes))
    stats = pool.run()
    progress.done(name, stats.done, kills=stats.crashes)
    figures = provider_figures(paths.work_dir / "naive-provider.db")
    return naive_figures(stats, figures, time.monotonic() - started)


def _status(stats: QueueStats, settler: Settler) -> dict[str, int]:
    return {"kills": stats.crashes, "in_doubt": stats.statuses["in_doubt"]
            + stats.statuses["unknown"], "reconciler_actions": settler.handled}
