"""What every command shares: settings read once, output helpers, error -> exit code."""

from __future__ import annotations

import errno
import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn

import click

from effectlog.errors import EffectlogError

if TYPE_CHECKING:
    from effectlog.log.base import EventLog

EXIT_OK, EXIT_NOT_FOUND, EXIT_USAGE, EXIT_CONFLICT, EXIT_UNAVAILABLE = 0, 1, 2, 3, 4
MAX_ERROR_LINE = 900
#: An unexpected error inside effectlog: one line (``internal error: …``), like Python's own 1.
EXIT_INTERNAL = 1
#: OS errors that mean the path given is unusable as written (exit 2); others are exit 4.
_BAD_PATH = frozenset({errno.ENAMETOOLONG, errno.ENOTDIR, errno.EISDIR, errno.EINVAL,
                       errno.ELOOP, errno.EEXIST})
#: Seconds a command waits for the log (the Kafka broker) before it fails with exit 4.
DEFAULT_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class CliContext:
    """Global options, passed to every command as ``ctx.obj``."""

    log_url: str
    state_dir: str
    timeout_s: float = DEFAULT_TIMEOUT_S

    @classmethod
    def checked(cls, log_url: str, state_dir: str,
                timeout_s: float = DEFAULT_TIMEOUT_S) -> CliContext:
        """The context, once the global options are usable as a URL and a path."""
        if not state_dir.strip() or "\x00" in state_dir:
            raise click.BadParameter("must be a directory path", param_hint="--state")
        if "\x00" in log_url:
            raise click.BadParameter("must not contain a NUL character", param_hint="--log")
        for hint, value in (("--state", state_dir), ("--log", log_url)):  # e.g. from the env
            if not _utf8(value):
                raise click.BadParameter("is not valid UTF-8", param_hint=hint)
        return cls(log_url=log_url, state_dir=state_dir, timeout_s=timeout_s)

    def open_log(self, *, create: bool = False, against_state: bool = True) -> EventLog:
        """The log, never created unless ``create`` and no state claims another one; with
        ``against_state``, refused (exit 4) when it is not the log the state was built from
        (see :mod:`effectlog.cli.log_guard`)."""
        from effectlog.cli.log_guard import open_checked

        log = open_checked(self.log_url, self.state_dir, create=create,
                           against_state=against_state)
        if is_kafka(self.log_url):  # reach the broker first, the same way for every command
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


def fail(message: str, code: int) -> NoReturn:
    """Print a one-line error on stderr (secrets masked, control characters escaped) and
    exit with ``code``."""
    from effectlog.redact import scrub_text
    from effectlog.text import printable

    line = message.splitlines()[0] if message.strip() else "failed"
    if len(line) > MAX_ERROR_LINE:  # an error quoting a megabyte argument stays one short line
        line = line[:MAX_ERROR_LINE] + "…"
    click.echo(f"error: {printable(scrub_text(line))}", err=True)
    sys.exit(code)


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _os_error(exc: OSError) -> tuple[str, int]:
    """A one-line message and exit code for an OS error no command handled itself."""
    from effectlog.text import shorten

    where = f": {shorten(os.fsdecode(exc.filename), 200)}" if exc.filename else ""
    text = f"{exc.strerror or exc}{where}"
    return text, EXIT_USAGE if exc.errno in _BAD_PATH else EXIT_UNAVAILABLE


class OutputClosed(Exception):
    """The reader of stdout went away (``effectlog replay | head``)."""


def end_as_unix_tools_do() -> NoReturn:
    """After a broken pipe: end silently by SIGPIPE (status 141 in a shell), as ``cat`` and
    ``grep`` do, so ``set -o pipefail`` sees that the output was cut short."""
    import signal

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # the final flush must not fail again
    except (OSError, ValueError):
        pass
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGPIPE)
    sys.exit(128 + signal.SIGPIPE)  # not reached


def run_guarded(command: click.Command, argv: list[str] | None = None) -> NoReturn:
    """Run ``command`` and exit with its code: EffectlogError -> one line and its exit
    code; usage errors -> 2; OS errors -> 2 for an unusable path, else 4; a RocksDB error
    -> 4; anything else -> one ``internal error`` line and 1. Never a traceback
    (``--log-level DEBUG`` logs it). A closed stdout pipe ends the process by SIGPIPE.

    Files the CLI creates are private whatever the caller's umask (directories 0700,
    files 0600): the umask is set to 077 first.
    """
    os.umask(0o077)
    for arg in sys.argv[1:] if argv is None else argv:
        if not _utf8(arg):  # bytes that are not UTF-8 reach Python as lone surrogates
            fail(f"argument {arg.encode('utf-8', 'backslashreplace').decode()!r} is not "
                 "valid UTF-8", EXIT_USAGE)
    try:
        code = command.main(args=argv, prog_name="effectlog", standalone_mode=False)
        sys.stdout.flush()
    except click.exceptions.Abort:
        fail("aborted", 130)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        fail(exc.format_message(), EXIT_USAGE)
    except EffectlogError as exc:
        fail(str(exc) or type(exc).__name__, exc.exit_code)
    except (OutputClosed, BrokenPipeError):
        end_as_unix_tools_do()
    except OSError as exc:
        fail(*_os_error(exc))
    except Exception as exc:
        import logging

        logging.getLogger(__name__).debug("unhandled error", exc_info=True)
        if type(exc) is Exception:  # rocksdict's one error type: a RocksDB status (Corruption,
            fail(f"projection storage error: {exc}", EXIT_UNAVAILABLE)  # IO error, ...)
        fail(f"internal error: {type(exc).__name__}: {exc}", EXIT_INTERNAL)
    sys.exit(code if isinstance(code, int) else EXIT_OK)
