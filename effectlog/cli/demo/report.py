"""The demo's figures: what the provider saw, what the log says, and the closing table.

Provider figures come from the fake provider's own counters (how often each key's effect
was really performed), so "duplicate effects" is measured where the harm would be done.
"""

from __future__ import annotations

import sqlite3
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from effectlog.cli.demo.pool import QueueStats
from effectlog.model import State
from projections.store import ProjectionReader


@dataclass(frozen=True, slots=True)
class ProviderFigures:
    """Per provider file: calls received, effects performed, effects performed twice or more."""

    calls: int
    effects: int
    duplicates: int
    executions: dict[str, int]


def provider_figures(path: Path) -> ProviderFigures:
    """Read the fake provider's counters straight from its SQLite file."""
    db = sqlite3.connect(path)
    try:
        rows = db.execute("SELECT key, executions, calls FROM effects").fetchall()
    finally:
        db.close()
    executions = {str(key): int(n) for key, n, _ in rows}
    return ProviderFigures(calls=sum(int(c) for _, _, c in rows), effects=sum(executions.values()),
                           duplicates=sum(max(0, n - 1) for n in executions.values()),
                           executions=executions)


@dataclass(frozen=True, slots=True)
class RunFigures:
    """One run's row set; ``None`` where a figure does not exist for that run."""

    operations: int
    deliveries: int
    worker_kills: int
    provider_calls: int
    provider_effects: int
    duplicate_effects: int
    succeeded: int
    reconciled: int | None = None
    awaiting_approval: int | None = None
    unresolved: int | None = None
    rejected_stale_writes: int | None = None
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def effectlog_figures(queue: QueueStats, provider: ProviderFigures, reader: ProjectionReader,
                      reconciler_id: str, seconds: float) -> tuple[RunFigures, list[str]]:
    """The effectlog run's figures, and the keys awaiting approval."""
    reader.refresh()
    counts = reader.counts()

    def count(*states: State) -> int:
        return sum(counts.get(f"state:{s.value}", 0) for s in states)

    reconciled = sum(1 for state in (State.SUCCEEDED, State.FAILED)
                     for event in reader.scan_state(state) if event.worker_id == reconciler_id)
    awaiting = [e.idempotency_key for e in reader.scan_state(State.AWAITING_APPROVAL)]
    projector_rejected = sum(n for name, n in counts.items() if name.startswith("rejected:"))
    figures = RunFigures(
        operations=queue.jobs, deliveries=queue.deliveries, worker_kills=queue.crashes,
        provider_calls=provider.calls, provider_effects=provider.effects,
        duplicate_effects=provider.duplicates, succeeded=count(State.SUCCEEDED),
        reconciled=reconciled, awaiting_approval=len(awaiting),
        unresolved=count(State.RESERVED, State.DISPATCHED, State.UNKNOWN),
        rejected_stale_writes=queue.stale_rejected + queue.provider_refused + projector_rejected,
        seconds=round(seconds, 1))
    return figures, awaiting


def naive_figures(queue: QueueStats, provider: ProviderFigures, seconds: float) -> RunFigures:
    return RunFigures(
        operations=queue.jobs, deliveries=queue.deliveries, worker_kills=queue.crashes,
        provider_calls=provider.calls, provider_effects=provider.effects,
        duplicate_effects=provider.duplicates, succeeded=queue.statuses["succeeded"],
        seconds=round(seconds, 1))


_ROWS = (
    ("operations", "operations", "logical operations"),
    ("deliveries", "job deliveries", "incl. re-deliveries"),
    ("worker_kills", "worker SIGKILLs", "killed holding a job"),
    ("provider_calls", "provider calls", "calls reaching the provider"),
    ("provider_effects", "provider effects", "effects performed"),
    ("duplicate_effects", "duplicate effects", "performed more than once"),
    ("succeeded", "succeeded", "operations completed"),
    ("reconciled", "reconciled", "settled by recovery"),
    ("awaiting_approval", "awaiting approval", "left for a person"),
    ("unresolved", "unresolved", "stuck at the end"),
    ("rejected_stale_writes", "rejected stale writes", "fenced by epoch"),
    ("seconds", "seconds", "wall time"),
)


def table(effectlog: RunFigures, naive: RunFigures) -> Table:
    """The closing comparison table."""
    out = Table(title="effectlog demo: the same workload, crashes and faults",
                title_justify="left")
    out.add_column("")
    out.add_column("effectlog", justify="right")
    out.add_column("naive retry", justify="right")
    out.add_column("what it counts", style="dim")
    for field, label, meaning in _ROWS:
        ours, theirs = getattr(effectlog, field), getattr(naive, field)
        style = None
        if field == "duplicate_effects":
            style = "bold green" if ours == 0 else "bold red"
        out.add_row(label, _cell(ours, style), _cell(theirs, "bold red" if field ==
                                                     "duplicate_effects" and theirs else None),
                    meaning)
    return out


def _cell(value: int | float | None, style: str | None) -> str:
    text = "-" if value is None else str(value)
    return f"[{style}]{text}[/]" if style else text


def print_table(console: Console, effectlog: RunFigures, naive: RunFigures,
                awaiting: list[str], cli: str) -> None:
    """The table, then the command that decides on each effect awaiting approval (``cli``
    is the ``effectlog --log .. --state ..`` prefix of this run)."""
    import shlex

    console.print(table(effectlog, naive))
    if not awaiting:
        return
    console.print(f"{len(awaiting)} effect(s) await a decision: the provider's lookup never "
                  "answered, so effectlog cannot tell whether they happened. Check each, "
                  "then abandon it (or --decision retry: re-dispatch with the same key):",
                  highlight=False)
    for key in awaiting:
        console.print(f"  {cli} approve {shlex.quote(key)} --decision abandon --by YOU "
                      "--reason WHY", highlight=False, soft_wrap=True)
