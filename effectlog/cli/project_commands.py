"""``effectlog project`` (the projector) and ``effectlog rebuild`` (fresh projection, swapped in).

Both report their lag first, then progress: a rich progress bar on a terminal, a log line
every few seconds otherwise. SIGTERM or SIGINT finishes the current batch, stores its
offsets with it and exits 0.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING, Any, TypeVar

import click

from effectlog.cli.context import CliContext, fail

if TYPE_CHECKING:
    from projections.projector import DecoderChoice, Progress

_LINE_EVERY_S = 2.0
F = TypeVar("F", bound=Callable[..., Any])


def _stop_on_signals() -> threading.Event:
    stop = threading.Event()

    def handler(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    return stop


class _Reporter:
    """Shows a run's progress: a rich bar on a TTY, else a line on stderr every 2 s."""

    def __init__(self, label: str, quiet: bool = False) -> None:
        self.label = label
        self.quiet = quiet
        self._bar: Any = None
        self._task: Any = None
        self._announced = False
        self.last: Progress | None = None
        if not quiet and sys.stderr.isatty():
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self._bar = Progress(TextColumn("{task.description}"), BarColumn(),
                                 MofNCompleteColumn(), TextColumn("{task.fields[rate]}"),
                                 TimeRemainingColumn(), console=Console(stderr=True))
        self._started = self._last = time.monotonic()

    def __enter__(self) -> _Reporter:
        if self._bar is not None:
            self._bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()

    def __call__(self, progress: Progress) -> None:
        self.last = progress
        if self.quiet:
            return
        if not self._announced:
            self._announced = True
            lag = ", ".join(f"p{p}={n}" for p, n in sorted(progress.lag.items())) or "none"
            click.echo(f"{self.label}: {progress.total_lag} events behind the log ({lag})",
                       err=True)
        elapsed = max(time.monotonic() - self._started, 1e-6)
        rate = f"{progress.records / elapsed:,.0f} ev/s"
        if self._bar is not None:
            total = progress.records + progress.total_lag
            if self._task is None:
                self._task = self._bar.add_task(self.label, total=total, rate=rate)
            self._bar.update(self._task, completed=progress.records, total=total, rate=rate)
            return
        now = time.monotonic()
        if now - self._last >= _LINE_EVERY_S:
            self._last = now
            self.line(progress, rate)

    def finish(self) -> None:
        """The closing summary line."""
        if not self.quiet and self.last is not None:
            elapsed = max(time.monotonic() - self._started, 1e-6)
            self.line(self.last, f"{self.last.records / elapsed:,.0f} ev/s")

    def line(self, progress: Progress, rate: str) -> None:
        click.echo(f"{self.label}: {progress.records} events ({progress.accepted} accepted, "
                   f"{progress.rejected} rejected) {rate}, lag {progress.total_lag}", err=True)


def accept_gaps_option(command: F) -> F:
    """``--accept-compaction-gaps`` (``project``, ``rebuild``, ``serve``)."""
    return click.option(
        "--accept-compaction-gaps", "accept_gaps", is_flag=True,
        help="Apply past a stretch of the compacted events topic that compaction may have "
        "thinned before it was projected (logged), instead of halting there (serve: the "
        "partition stops serving; project, rebuild: exit 3).")(command)


def _run_options(command: F) -> F:
    """Options shared by ``project`` and ``rebuild``."""
    command = accept_gaps_option(command)
    command = click.option("--quiet", is_flag=True, help="No progress output.")(command)
    command = click.option(
        "--decoder", type=click.Choice(["auto", "inline", "process"]), default="auto",
        show_default=True, help="Where Avro is decoded: auto uses a helper process while "
        "catching up; inline stays in this process.")(command)
    return click.option("--batch-size", type=click.IntRange(min=1), default=2000,
                        show_default=True)(command)


@click.command()
@click.option("--once", is_flag=True,
              help="Stop when caught up with the log's end offsets seen at the start.")
@_run_options
@click.pass_obj
def project(obj: CliContext, once: bool, batch_size: int, decoder: DecoderChoice,
            quiet: bool, accept_gaps: bool) -> None:
    """Apply the log to the RocksDB projection (exactly once, resumable after any kill)."""
    from projections.projector import Projector, ProjectorSettings

    stop = _stop_on_signals()
    log = obj.open_log()
    try:
        log.verify()  # a log its own backend reports damaged is refused before projecting
        settings = ProjectorSettings(batch_size=batch_size, decoder=decoder,
                                     accept_compaction_gaps=accept_gaps)
        with Projector(log, obj.state_dir, settings) as projector, \
                _Reporter("project", quiet) as report:
            projector.run(once=once, stop=stop, on_progress=report)
    finally:
        log.close()
    report.finish()
    if not quiet and stop.is_set():
        click.echo("project: stopped on signal; offsets stored", err=True)


@click.command()
@_run_options
@click.pass_obj
def rebuild(obj: CliContext, batch_size: int, decoder: DecoderChoice, quiet: bool,
            accept_gaps: bool) -> None:
    """Build a fresh projection from the whole log beside the current one, then swap it in.

    The current projection stays readable until the swap; a running project follows it.
    """
    from consumers.bookkeeping import adopt_log
    from projections.projector import ProjectorSettings
    from projections.rebuild import rebuild as run_rebuild

    stop = _stop_on_signals()
    before = _logs_claimed(obj.state_dir)
    log = obj.open_log(against_state=False)  # the one command that adopts a new log
    try:
        log.verify()
        with _Reporter("rebuild", quiet) as report:
            settings = ProjectorSettings(batch_size=batch_size, decoder=decoder,
                                     accept_compaction_gaps=accept_gaps)
            final = run_rebuild(log, obj.state_dir, settings, on_progress=report, stop=stop)
        if final is None:
            fail("rebuild stopped before the end; the current projection is unchanged", 130)
        reset = adopt_log(obj.state_dir, log)  # bookkeeping of an earlier log is void now
        identity = log.identity()
    finally:
        log.close()
    report.finish()
    click.echo(f"rebuild: {obj.state_dir} -> {final.name}", err=True)
    if identity is not None and before - {identity}:
        click.echo(f"rebuild: adopted log {identity} (was {', '.join(sorted(before))})"
                   + (f"; reset {', '.join(p.name for p in reset)}" if reset else ""), err=True)


def _logs_claimed(state_dir: str) -> set[str]:
    """The logs the current projection says it was built from, so that a rebuild onto
    another log says that it adopted it. A projection that cannot be read (damaged) does
    not stop the rebuild that replaces it: one WARNING says what is not known about it."""
    from effectlog.cli.log_guard import projection_claims
    from projections.rocksdb.db import ProjectionDamaged
    from projections.rocksdb.layout import check_state_dir

    check_state_dir(state_dir)  # something other than a projection is refused, not rebuilt
    try:
        claims = projection_claims(state_dir)
    except Exception as exc:
        if isinstance(exc, ProjectionDamaged):
            reason = f"{exc.path}: {exc.status}"
        elif type(exc) is Exception:  # rocksdict's one error type: a RocksDB status
            reason = str(exc)
        else:
            raise
        import logging

        logging.getLogger(__name__).warning(
            "the current projection could not be read (%s): rebuilding it from the log "
            "without knowing which log and offsets it was built from, so a change of log is "
            "not reported", reason.splitlines()[0] if reason else "unknown error")
        return set()
    return {i for i, _ in claims.values() if i is not None}
