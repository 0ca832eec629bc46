"""What every command shares: settings read once, output helpers, error -> exit code."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import click

from effectlog.errors import EffectlogError

if TYPE_CHECKING:
    from effectlog.log.base import EventLog

EXIT_OK, EXIT_NOT_FOUND, EXIT_USAGE, EXIT_CONFLICT, EXIT_UNAVAILABLE = 0, 1, 2, 3, 4
#: Seconds a command waits for the log (the Kafka broker) before it fails with exit 4.
DEFAULT_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class CliContext:
    """Global options, passed to every command as ``ctx.obj``."""

    log_url: str
    state_dir: str
    timeout_s: float = DEFAULT_TIMEOUT_S

    def open_log(self) -> EventLog:
        """The log. A Kafka broker is reached first (under a spinner on a terminal), so a
        broker that is down fails every command the same way, within ``timeout_s``."""
        from effectlog.log import open_log

        log = open_log(self.log_url)
        if is_kafka(self.log_url):
            from effectlog.log.base import EVENTS

            try:
                with waiting(f"reaching {log.url} (up to {self.timeout_s:g}s)"):
                    log.end_offsets(EVENTS)
            except BaseException:
                log.close()
                raise
        return log


def is_kafka(log_url: str) -> bool:
    return log_url.lower().startswith("kafka")


def with_timeout(log_url: str, seconds: float) -> str:
    """``log_url`` with its Kafka ``timeout_s`` parameter set to ``seconds``; other logs'
    URLs unchanged."""
    if not is_kafka(log_url):
        return log_url
    from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

    parts = urlsplit(log_url)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != "timeout_s"]
    return urlunsplit(parts._replace(query=urlencode([*query, ("timeout_s", f"{seconds:g}")])))


@contextmanager
def waiting(text: str) -> Iterator[None]:
    """A rich spinner with ``text`` on stderr while the block runs (on a terminal only)."""
    if not sys.stderr.isatty():
        yield
        return
    from rich.console import Console

    with Console(stderr=True).status(text):
        yield


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
        return command.main(args=argv, prog_name="effectlog", standalone_mode=False)
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
