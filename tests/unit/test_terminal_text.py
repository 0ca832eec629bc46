"""Control and bidi characters never reach a terminal: free text is refused on input, and
whatever is already in the log is shown escaped (history, get, list, replay, errors)."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from effectlog.codec import event_codec
from effectlog.errors import InvalidInput
from effectlog.log import EVENTS, open_log
from effectlog.machine import advance, new_effect
from effectlog.model import Approval, Decision, Transition
from effectlog.text import check_free_text, printable
from effectlog.worker import Worker
from projections.projector import project

EFFECTLOG = Path(sys.executable).with_name("effectlog")
KIND, TARGET = "email.send", "mailto:a@example.com"
HOSTILE = ["\x1b[2J", "\x00", "\u202e", "\u200b", "\u2028", "\x07", "\x9b", "\t", "\n"]
#: What must never appear in terminal output: ESC, NUL, C1 CSI, bidi overrides, BEL.
RAW = ("\x1b", "\x00", "\x9b", "\u202e", "\x07")


def cli(tmp: Path, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(EFFECTLOG), "--log", f"sqlite:///{tmp}/log.db", "--state",
                           str(tmp / "state"), *args], capture_output=True, text=True,
                          input=stdin, timeout=60, cwd=tmp, env={"COLUMNS": "300",
                                                                 "PATH": "/usr/bin:/bin"})


def clean(text: str) -> bool:
    return not any(char in text for char in RAW)


@pytest.mark.parametrize("char", HOSTILE, ids=repr)
def test_free_text_with_control_or_bidi_characters_is_refused(char: str) -> None:
    with pytest.raises(InvalidInput, match="control"):
        check_free_text("worker_id", f"w{char}1")


def test_printable_escapes_visibly_and_keeps_the_rest() -> None:
    assert printable("ok \u00e9\u4e2d") == "ok \u00e9\u4e2d"
    assert printable("a\x1b[31mb\u202ec\x00") == "a\\x1b[31mb\\u202ec\\x00"


@pytest.mark.parametrize("char", ["\x1b[31m", "\u202e", "\x7f"], ids=repr)
def test_workers_refuse_such_worker_ids(tmp_path: Path, char: str) -> None:
    log = open_log(f"sqlite:///{tmp_path}/log.db")
    with pytest.raises(InvalidInput):
        Worker(log, f"mailer{char}")
    line = json.dumps({"operation_id": "op-1", "kind": KIND, "target": TARGET, "payload": {},
                       "transition": "create", "worker_id": f"w{char}"}) + "\n"
    done = cli(tmp_path, "append", stdin=line)
    assert done.returncode == 2 and "control character" in done.stderr
    assert log.end_offsets(EVENTS) == {0: 0} and clean(done.stderr)


def test_approve_refuses_a_reason_with_a_bidi_override(tmp_path: Path) -> None:
    log = open_log(f"sqlite:///{tmp_path}/log.db")
    worker = Worker(log, "w1")
    key = worker.create("op-1", KIND, TARGET, {}).idempotency_key
    worker.reserve(key)
    worker.dispatch(key)
    worker.unknown(key, "timeout")
    before = log.end_offsets(EVENTS)
    done = cli(tmp_path, "approve", key, "--decision", "retry", "--by", "alice\x1b[8m",
               "--reason", "fine")
    assert done.returncode == 2 and clean(done.stderr)
    assert log.end_offsets(EVENTS) == before


@pytest.fixture
def hostile_log(tmp_path: Path) -> tuple[Path, str]:
    """A log written by a tool that checked nothing: control characters in the worker id,
    the error and the approval reason, written straight through the codec."""
    log = open_log(f"sqlite:///{tmp_path}/log.db")
    created = replace(new_effect("op-1", KIND, TARGET, {"s": "x"}, "w1"),
                      worker_id="evil\x1b[2J\u202e")
    reserved = advance(created, Transition.RESERVE, "evil\x1b]0;pwned\x07")
    dispatched = advance(reserved, Transition.DISPATCH, "evil\x1b]0;pwned\x07")
    unknown = advance(dispatched, Transition.UNKNOWN, "evil\x1b]0;pwned\x07",
                      error="lost\x1b[31m red \x9b1m")
    approved = advance(unknown, Transition.APPROVE, "approval:x",
                       approval=Approval(Decision.ABANDON, "x\u202e", "why\x00\x1b[5m"))
    codec = event_codec()
    for event in (created, reserved, dispatched, unknown, approved):
        log.append(EVENTS, created.idempotency_key, codec.encode(event.to_record()))
    log.append(EVENTS, "agent:op-2:email.send:\x1b[2J", b"junk")
    project(log, tmp_path / "state")
    return tmp_path, created.idempotency_key


@pytest.mark.parametrize("args", [("history", "{key}"), ("get", "{key}"), ("list",),
                                  ("replay", "--key", "{key}"), ("replay",),
                                  ("history", "{key}", "--json"), ("get", "{key}", "--json")],
                         ids=lambda a: "-".join(a).replace("{key}", "KEY"))
def test_what_is_in_the_log_reaches_the_terminal_escaped(hostile_log: tuple[Path, str],
                                                         args: tuple[str, ...]) -> None:
    tmp, key = hostile_log
    done = cli(tmp, *(a.format(key=key) for a in args))
    assert done.returncode in (0, 3), done.stderr
    assert clean(done.stdout) and clean(done.stderr)
    assert "Traceback" not in done.stderr


def test_history_table_shows_the_escapes(hostile_log: tuple[Path, str]) -> None:
    tmp, key = hostile_log
    done = cli(tmp, "history", key)
    assert done.returncode == 0, done.stderr
    assert "\\x1b[2J" in done.stdout and "\\u202e" in done.stdout


def test_rich_markup_in_keys_is_shown_not_interpreted(tmp_path: Path) -> None:
    log = open_log(f"sqlite:///{tmp_path}/log.db")
    key = Worker(log, "w[bold]1").create("op-1", KIND, "https://x.example/[/]#[red]", {}) \
        .idempotency_key
    project(log, tmp_path / "state")
    for args in (("history", key), ("get", key), ("list",)):
        done = cli(tmp_path, *args)
        assert done.returncode == 0, done.stderr
        assert "[/]" in done.stdout and "Traceback" not in done.stderr


def test_error_lines_escape_what_the_user_typed(tmp_path: Path) -> None:
    for args in (("\x1b[2Jcommand",), ("list", "--older-than", "\x1b[2J"),
                 ("get", "agent:op:k:\u202e")):
        done = cli(tmp_path, *args)
        assert done.returncode == 2 and clean(done.stderr)
        assert done.stderr.startswith("error:") and done.stderr.count("\n") == 1


def test_log_lines_escape_control_characters() -> None:
    import io
    import logging

    from effectlog.logging_setup import configure_logging

    stream = io.StringIO()
    handler = configure_logging("INFO", stream=stream)
    try:
        logging.getLogger("effectlog.test").warning("key %s from %s", "k\x1b[2J", "w\u202e")
    finally:
        logging.getLogger().removeHandler(handler)
    assert clean(stream.getvalue()) and "k\\x1b[2J" in stream.getvalue()
