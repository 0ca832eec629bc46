"""configure_logging: JSON lines or plain text, levels, extras, and secrets scrubbed."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from datetime import datetime

import pytest

from effectlog.errors import InvalidInput
from effectlog.logging_setup import configure_logging, parse_level
from effectlog.redact import SECRETS, register_secret

SECRET = "hunter2-xyz"


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    saved = SECRETS._values
    yield
    for handler in list(root.handlers):
        if handler not in handlers:
            root.removeHandler(handler)
    root.setLevel(level)
    SECRETS._values = saved
    logging.captureWarnings(False)


def test_json_mode_writes_one_object_per_line_with_extras() -> None:
    out = io.StringIO()
    configure_logging("info", json=True, stream=out)
    log = logging.getLogger("effectlog.projector")
    log.info("applied %d records", 42, extra={"partition": 3, "lag": {"events": 0}})
    log.debug("not shown at INFO")
    lines = out.getvalue().splitlines()
    assert len(lines) == 1
    entry = json.loads(lines[0])
    assert entry["level"] == "INFO" and entry["logger"] == "effectlog.projector"
    assert entry["message"] == "applied 42 records"
    assert entry["partition"] == 3 and entry["lag"] == {"events": 0}
    assert entry["ts"].endswith("Z") and datetime.fromisoformat(entry["ts"])


def test_json_mode_keeps_multiline_tracebacks_on_one_line() -> None:
    out = io.StringIO()
    configure_logging("warning", json=True, stream=out)
    try:
        {}["missing"]
    except KeyError:
        logging.getLogger("effectlog.serve").exception("lookup failed")
    (line,) = out.getvalue().splitlines()
    entry = json.loads(line)
    assert entry["level"] == "ERROR" and "KeyError: 'missing'" in entry["exc"]


def test_plain_mode_is_human_readable_with_key_values() -> None:
    out = io.StringIO()
    configure_logging("DEBUG", json=False, stream=out)
    logging.getLogger("effectlog.recovery").debug("stuck effects", extra={"count": 2})
    line = out.getvalue().strip()
    assert " DEBUG " in line and "effectlog.recovery: stuck effects count=2" in line
    with pytest.raises(json.JSONDecodeError):
        json.loads(line)


def test_secrets_are_scrubbed_in_both_formats() -> None:
    register_secret(SECRET)
    for as_json in (True, False):
        out = io.StringIO()
        configure_logging("info", json=as_json, stream=out)
        log = logging.getLogger("effectlog.log.kafka")
        log.info("connecting to kafka://u:%s@h:9092", SECRET)
        log.info("config", extra={"client": {"sasl.password": "other-secret"}})
        log.warning("url %s", "kafka://h:9092?sasl_password=never-shown")
        text = out.getvalue()
        assert SECRET not in text and "other-secret" not in text and "never-shown" not in text
        assert text.count("***") == 3


def test_configuring_again_replaces_the_handler_instead_of_doubling_output() -> None:
    first, second = io.StringIO(), io.StringIO()
    configure_logging("info", json=True, stream=first)
    configure_logging("info", json=True, stream=second)
    logging.getLogger("effectlog").info("once")
    assert first.getvalue() == "" and len(second.getvalue().splitlines()) == 1
    ours = [h for h in logging.getLogger().handlers if getattr(h, "_effectlog_handler", False)]
    assert len(ours) == 1


@pytest.mark.parametrize(("given", "level"), [("debug", 10), ("INFO", 20), (" warning ", 30),
                                              ("40", 40), (50, 50)])
def test_levels_parse_from_names_and_numbers(given: str | int, level: int) -> None:
    assert parse_level(given) == level


def test_unknown_level_is_invalid_input() -> None:
    with pytest.raises(InvalidInput):
        configure_logging("loud")
