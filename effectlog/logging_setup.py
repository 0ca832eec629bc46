"""Logging for the CLI and ``serve``: JSON lines or plain text on stderr, secrets scrubbed.

Library modules only call ``logging.getLogger(__name__)``; the entry points call
:func:`configure_logging` once with the options they read.
"""

from __future__ import annotations

import json as _json
import logging
import sys
from datetime import UTC, datetime
from typing import IO, Any

from effectlog.errors import InvalidInput
from effectlog.redact import STANDARD_RECORD_ATTRS, RedactingFilter

_MARK = "_effectlog_handler"
PLAIN_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"


def parse_level(level: str | int) -> int:
    """``debug``/``INFO``/``20`` -> a logging level number."""
    if isinstance(level, int) and not isinstance(level, bool):
        return level
    text = str(level).strip().upper()
    if text.isdigit():
        return int(text)
    number = logging.getLevelNamesMapping().get(text)
    if number is None:
        raise InvalidInput(f"invalid log level {level!r}: use debug, info, warning, error "
                           "or critical")
    return number


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in vars(record).items()
            if k not in STANDARD_RECORD_ATTRS and not k.startswith("_")}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts (UTC ISO-8601, ms), level, logger, message, the
    record's ``extra`` fields, and ``exc``/``stack`` text when present."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds")
            .replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name, value in _extras(record).items():
            out.setdefault(name, value)
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            out["exc"] = record.exc_text
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return _json.dumps(out, default=str, ensure_ascii=False)


class PlainFormatter(logging.Formatter):
    """``time LEVEL logger: message key=value ...`` for people at a terminal."""

    def __init__(self) -> None:
        super().__init__(PLAIN_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        from effectlog.text import printable

        # Each line escaped: text from the log cannot steer the terminal reading stderr.
        text = "\n".join(printable(line) for line in super().format(record).split("\n"))
        extras = _extras(record)
        if not extras:
            return text
        first, newline, rest = text.partition("\n")
        pairs = " ".join(f"{k}={_json.dumps(v, default=str, ensure_ascii=False)}"
                         for k, v in extras.items())
        return f"{first} {pairs}{newline}{rest}"


def configure_logging(level: str | int = "WARNING", json: bool = False,
                      stream: IO[str] | None = None) -> logging.Handler:
    """Route all logging to one stderr handler (JSON lines if ``json``) with secrets
    scrubbed; calling it again replaces the handler it installed before."""
    number = parse_level(level)
    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(handler, _MARK, False):
            root.removeHandler(handler)
            handler.close()
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter() if json else PlainFormatter())
    handler.addFilter(RedactingFilter())
    setattr(handler, _MARK, True)
    root.addHandler(handler)
    root.setLevel(number)
    logging.captureWarnings(True)
    return handler
