"""How the CLI shows things to people: ISO-8601 UTC times, each event's own detail, tables
that use the terminal's width and never cut the columns people copy (keys)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

#: Snapshot fields that hold epoch milliseconds (shown as ISO-8601 UTC in tables).
TIME_FIELDS = frozenset({"created_at", "occurred_at", "logged_at", "at"})


def iso_utc(ms: int) -> str:
    """``2024-05-01T12:00:00.123Z`` for epoch milliseconds."""
    from datetime import UTC, datetime

    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def event_detail(event: dict[str, Any]) -> str:
    """What this event itself says (the JSON view of one event): the decision of an APPROVE,
    the outcome of a RECORD, the error of an UNKNOWN or AWAIT_APPROVAL, the payload
    reference of a CREATE. Snapshots carry the outcome and approval forward; later rows
    must not repeat them."""
    transition = event.get("transition")
    approval, outcome = event.get("approval"), event.get("outcome")
    if transition == "APPROVE" and approval:
        return f"{approval['decision']} by {approval['by']}: {approval['reason']}"
    if transition == "RECORD" and outcome:
        return outcome_text(outcome)
    if event.get("error"):
        return str(event["error"])
    if transition == "CREATE" and event.get("payload_ref"):
        return f"payload ref {event['payload_ref']}"
    return ""


def outcome_text(outcome: dict[str, Any], limit: int = 80) -> str:
    """``SUCCEEDED (reconciler: re-dispatch): {"id": …}``: the status, who learned it and
    the result (cut at ``limit`` characters)."""
    from effectlog.model import recorded_by

    result = json.dumps(outcome.get("result"), sort_keys=True)
    return f"{outcome['status']} ({recorded_by(outcome.get('source'))}): {_clip(result, limit)}"


def _clip(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


def show_value(name: str, value: Any) -> str:
    """One snapshot field as a table cell: times as ISO-8601 UTC, structures as JSON."""
    if name in TIME_FIELDS and isinstance(value, int):
        return iso_utc(value)
    if name == "outcome" and isinstance(value, dict) and "status" in value:
        return outcome_text(value, limit=10_000)
    if isinstance(value, dict):
        return json.dumps({k: show_value(k, v) if k in TIME_FIELDS else v
                           for k, v in value.items()}, sort_keys=True)
    if isinstance(value, list):
        return json.dumps(value, sort_keys=True)
    return str(value)


def print_table(title: str | None, columns: list[str], rows: list[list[Any]], *,
                fold: tuple[str, ...] = ()) -> None:
    """A rich table on stdout, as wide as the terminal. Only the ``fold`` columns (free
    text) wrap; every other column (keys, states, times) is never wrapped or cut: where
    they do not fit, the table is printed wider than the terminal, without rules (the
    terminal wraps its lines), rather than eliding anything, so whatever is shown can be
    copied and pasted."""
    from rich.cells import cell_len
    from rich.table import Table
    from rich.text import Text

    from effectlog.text import printable

    # Cells are Text, never markup (a "[" in a key or worker id is shown, not interpreted),
    # with control and bidi characters escaped: what a writer put into the log cannot steer
    # the reader's terminal.
    cells = [["" if v is None else printable(str(v)) for v in row] for row in rows]
    table = Table(show_edge=False)
    needed = len(columns) - 1  # the column separators
    for index, column in enumerate(columns):
        texts = [column, *(row[index] for row in cells)]
        if column in fold:
            table.add_column(column, overflow="fold")
            needed += min(max(cell_len(text) for text in texts), _FOLD_MIN) + 2
        else:
            table.add_column(column, no_wrap=True, overflow="ignore")
            needed += max(cell_len(text) for text in texts) + 2
    for row in cells:
        table.add_row(*(Text(cell) for cell in row))
    console = stdout_console()
    if needed > console.width:  # wider than the terminal: no rules for it to wrap as well
        console = stdout_console(width=needed)
        table.box = None
    if title:
        console.print(Text(printable(title)), soft_wrap=True)
    console.print(table)


_FOLD_MIN = 30  # a free-text column is folded no narrower than this


def stdout_console(width: int | None = None) -> Console:
    """rich's console on stdout, except that a closed pipe (``| head``) ends the command as
    every other output does (SIGPIPE, status 141; see
    :func:`effectlog.cli.context.run_guarded`), not with rich's own quiet exit 1."""
    from rich.console import Console

    class Stdout(Console):
        def on_broken_pipe(self) -> None:
            raise BrokenPipeError

    return Stdout(highlight=False, width=width)
