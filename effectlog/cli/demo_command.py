"""``effectlog demo``: a simulated agent workload with real crashes, effectlog against naive
retries. The engine lives in :mod:`effectlog.cli.demo`."""

from __future__ import annotations

import logging
import sys

import click
from click.core import ParameterSource

from effectlog.cli.context import CliContext, emit_json, is_kafka, waiting
from effectlog.redact import redact_url

DEMO_LOG = "sqlite:///.effectlog/demo/log.db"
#: Each kind of log keeps its demo state apart: a Kafka run never touches the SQLite one's.
DEMO_STATE = {"sqlite": ".effectlog/demo/state", "kafka": ".effectlog/demo-kafka/state"}


def _explicit(ctx: click.Context, name: str) -> bool:
    """Whether a global option was given (flag or environment), not left at its default."""
    parent = ctx.parent
    source = parent.get_parameter_source(name) if parent is not None else None
    return source not in (None, ParameterSource.DEFAULT)


@click.command()
@click.option("--workers", type=click.IntRange(1, 64), default=4, show_default=True,
              help="Worker processes running the job queue.")
@click.option("--operations", type=click.IntRange(1, 100_000), default=300, show_default=True,
              help="Logical operations in the workload.")
@click.option("--crash-rate", type=click.FloatRange(0.0, 0.9), default=0.1, show_default=True,
              help="Chance that a job delivery is SIGKILLed at a transition boundary.")
@click.option("--seed", type=int, default=7, show_default=True,
              help="Seeds the workload, its crash points and provider faults.")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
@click.pass_context
def demo(ctx: click.Context, workers: int, operations: int, crash_rate: float, seed: int,
         as_json: bool) -> None:
    """Run a simulated agent workload with crashes and provider faults, through effectlog
    and through a naive retry-on-restart worker; compare the provider effects.

    Without --log/--state it keeps its files under .effectlog/demo/ (on a Kafka --log,
    fresh topics and .effectlog/demo-kafka/). Each run starts fresh: it deletes the files
    of the previous demo run on the same kind of log there (and nothing else).
    Exit 1 if effectlog caused a duplicate effect or left an effect stuck.
    """
    from rich.console import Console

    from effectlog.cli.demo.progress import DemoProgress
    from effectlog.cli.demo.report import print_table
    from effectlog.cli.demo.run import DemoSettings, prepare, run_demo
    from effectlog.cli.demo.workload import WorkloadSettings
    from effectlog.cli.formatting import stdout_console

    obj: CliContext = ctx.obj
    log_url = obj.log_url if _explicit(ctx, "log_url") else DEMO_LOG
    state_dir = obj.state_dir if _explicit(ctx, "state_dir") else \
        DEMO_STATE["kafka" if is_kafka(log_url) else "sqlite"]
    if logging.getLogger().level >= logging.WARNING:
        # The demo provokes lost races and fenced writes on purpose; they are counted, not news.
        logging.getLogger("consumers").setLevel(logging.ERROR)
    err = Console(stderr=True)
    with waiting(f"creating fresh demo topics on {redact_url(log_url)}" if is_kafka(log_url)
                 else "preparing the demo's files"):
        paths, removed = prepare(log_url, state_dir)
    progress = DemoProgress(err)
    progress.note(f"effectlog demo: log {paths.log_url}, state {paths.state_dir}")
    if removed:
        progress.note(f"starting fresh: removed the previous demo run's {len(removed)} "
                      f"file(s) there")
    progress.note(f"{operations} operations, {workers} workers, crash rate {crash_rate}, "
                  f"seed {seed}")
    settings = DemoSettings(workers, WorkloadSettings(operations=operations,
                                                      crash_rate=crash_rate, seed=seed))
    with progress:
        result = run_demo(paths, settings, progress)
    if as_json:
        emit_json({"effectlog": result.effectlog.to_json(), "naive": result.naive.to_json(),
                   "awaiting_approval": result.awaiting, "settled": result.settled,
                   "reconciler_actions": result.reconciler_actions,
                   "log": paths.log_url, "state": str(paths.state_dir),
                   "settings": {"workers": workers, "operations": operations,
                                "crash_rate": crash_rate, "seed": seed}})
    else:
        print_table(stdout_console(), result.effectlog, result.naive, result.awaiting,
                    f"effectlog --log {paths.log_url} --state {paths.state_dir}")
    problems = []
    if result.effectlog.duplicate_effects:
        problems.append(f"effectlog caused {result.effectlog.duplicate_effects} duplicate effect(s)")
    if not result.settled or result.effectlog.unresolved:
        problems.append(f"{result.effectlog.unresolved} effect(s) still stuck after recovery")
    if problems:
        click.echo("demo FAILED: " + "; ".join(problems), err=True)
        sys.exit(1)
