"""Progress of a demo run on stderr: rich bars on a terminal, a line per phase otherwise."""

from __future__ import annotations

import time
from types import TracebackType
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn


class DemoProgress:
    """One bar per phase (effectlog workers, settling, naive workers) and a status field."""

    def __init__(self, console: Console, enabled: bool = True) -> None:
        self.console = console
        self.live = enabled and console.is_terminal
        self.quiet = not enabled
        self._bar: Progress | None = None
        self._tasks: dict[str, TaskID] = {}
        self._started: dict[str, float] = {}
        if self.live:
            self._bar = Progress(TextColumn("{task.description:<22}"), BarColumn(),
                                 MofNCompleteColumn(), TimeElapsedColumn(),
                                 TextColumn("{task.fields[status]}"), console=console)

    def __enter__(self) -> DemoProgress:
        if self._bar is not None:
            self._bar.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._bar is not None:
            self._bar.stop()

    def note(self, text: str) -> None:
        """A line of its own above the bars."""
        if not self.quiet:
            self.console.print(text, highlight=False)

    def phase(self, name: str, total: int) -> None:
        self._started[name] = time.monotonic()
        if self._bar is not None:
            self._tasks[name] = self._bar.add_task(name, total=total, status="")
        elif not self.quiet:
            self.console.print(f"{name}: {total} ...", highlight=False)

    def update(self, name: str, completed: int, **status: Any) -> None:
        if self._bar is not None and name in self._tasks:
            text = "  ".join(f"{k.replace('_', ' ')} {v}" for k, v in status.items())
            self._bar.update(self._tasks[name], completed=completed, status=text)

    def done(self, name: str, completed: int, **status: Any) -> None:
        self.update(name, completed, **status)
        if self._bar is None and not self.quiet:
            seconds = time.monotonic() - self._started.get(name, time.monotonic())
            text = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in status.items())
            self.console.print(f"{name}: {completed} done in {seconds:.1f}s ({text})",
                               highlight=False)
