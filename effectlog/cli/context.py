"""What every command shares: settings read once, output helpers, error -> exit code."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import click

from effectlog.errors import EffectlogError

if TYPE_CHECKING:
    from effectlog.log.base import EventLog

EXIT_OK, EXIT_NOT_FOUND, EXIT_USAGE, EXIT_CONFLICT, EXIT_UNAVAILABLE = 0, 1, 2, 3, 4


@dataclass(frozen=True)
class CliContext:
    """Global options, passed to every command as ``ctx.obj``."""

    log_url: str
    state_dir: str

    def open_log(self) -> EventLog:
        from effectlog.log import open_log

        return open_log(self.log_url)


def emit_json(value: Any) -> None:
    """One JSON document (or line) on stdout."""
    click.echo(json.dumps(value, sort_keys=True, default=str))


def fail(message: str, code: int) -> None:
    """Print a one-line error on stderr and exit with ``code``."""
    from effectlog.redact import scrub_text

    click.echo(f"error: {scrub_text(message)}", err=True)
    sys.exit(code)


def run_guarded(command: click.Command, argv: list[str] | None = None) -> Any:
    """Run ``command``; EffectlogError -> one line and its exit code; usage errors -> 2."""
    try:
        return command.main(args=argv, standalone_mode=False)
    except click.exceptions.Abort:
        fail("aborted", 130)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        fail(exc.format_message(), EXIT_USAGE)
    except EffectlogError as exc:
        fail(str(exc).splitlines()[0] if str(exc) else type(exc).__name__, exc.exit_code)
    except BrokenPipeError:
        sys.exit(EXIT_OK)
    return None
