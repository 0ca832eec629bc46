"""A property-based fuzz of every CLI command's arguments and stdin (hypothesis).

Each example runs one command line in-process through the console entry's error handling
(``run_guarded``), against a small world (a projected SQLite log with effects in several
states, a second log, a damaged file, missing paths). Properties: no Python traceback, an
exit code in {0, 1, 2, 3, 4}, at most one ``error:`` line, no ``internal error`` (the
safety net is never what answers), and read commands create no file. A smaller sample of
the same command lines runs through the installed console script.

Long-running forms are not generated (``project``/``recover``/``reconcile`` always get
``--once``; ``serve``, ``fake-provider serve`` and ``demo`` only with a value that fails
to parse), and every path stays inside the test's directory.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from effectlog.cli.context import run_guarded
from effectlog.cli.main import cli
from effectlog.log import open_log
from effectlog.model import State
from effectlog.worker import Worker
from projections.projector import project
from tests.recovery_support import stuck

EFFECTLOG = Path(sys.executable).with_name("effectlog")
KIND, TARGET = "email.send", "mailto:a@example.com"
READS = {"get", "list", "stats", "history", "replay"}
COMMAND_NAMES = {"append", "history", "get", "list", "stats", "replay", "project", "rebuild",
                 "recover", "reconcile", "approve", "topics", "serve", "fake-provider", "demo"}
KEYS = [f"agent:op-{name}:{KIND}:{TARGET}" for name in ("done", "unknown", "dispatched")]
EDGE = ["", " ", "-", "--", "0", "-1", "1", "9" * 5000, "1h" * 40, "\x1b[2J", "\u202e", "[/]",
        "[bold]x", "%s%n", "{}", "null", "nan", "inf", "1e309", "2024-13-45T99:99:99Z",
        "2024-05-01T12:00:00Z", "90s", "1h30m", "0s", "5m", "x" * 3000, "é中", "\ud800",
        "a=b password=hunter2", *KEYS, "agent:x:y:z", "agent:op:Bad Kind:t"]
CONTROL = "\x00\x01\x07\x08\x1b\x7f\x9b\u200b\u2028\u202e\ufeff"

junk = st.one_of(st.sampled_from(EDGE), st.text(max_size=30),
                 st.text(alphabet=CONTROL + "ab:=1", max_size=12),
                 st.integers(-10**20, 10**20).map(str))


def mostly(good: st.SearchStrategy[str], bad: st.SearchStrategy[str] = junk
           ) -> st.SearchStrategy[str]:
    """``good`` three times in four, so examples get past argument parsing."""
    return st.one_of(good, good, good, bad)


name = st.text(alphabet="abcxyz019._-", min_size=1, max_size=12).filter(
    lambda s: s not in (".", ".."))
json_value = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=20)
                          | st.floats(allow_nan=False, allow_infinity=False),
                          lambda inner: st.lists(inner, max_size=4)
                          | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                          max_leaves=12)
TRANSITIONS = ["create", "reserve", "claim", "dispatch", "record", "unknown", "await_approval",
               "approve", "teleport", "", "CREATE"]


def request_line() -> st.SearchStrategy[str]:
    """One append request: mostly well-formed fields with fuzzed values, sometimes junk."""
    fields = st.fixed_dictionaries(
        {"operation_id": mostly(st.sampled_from(["done", "unknown", "dispatched", "new"]).map(
            lambda s: f"op-{s}")),
         "kind": mostly(st.just(KIND)), "target": mostly(st.just(TARGET)),
         "transition": mostly(st.sampled_from(TRANSITIONS)),
         "worker_id": mostly(st.just("w1"))},
        optional={"payload": json_value, "fencing_epoch": st.integers(-2, 2**70) | junk,
                  "outcome": json_value | st.just({"status": "succeeded", "result": {}}),
                  "error": junk, "payload_ref": junk})
    return st.one_of(fields.map(lambda d: json.dumps(d)), fields.map(lambda d: json.dumps(d)),
                     fields.map(lambda d: json.dumps(d)), junk, json_value.map(json.dumps),
                     st.just("[" * 100_000), st.binary(max_size=40).map(
                         lambda b: b.decode("latin-1")))


class World:
    """Paths the command lines point at; everything lives under ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        log = open_log(f"sqlite:///{root}/log.db")
        worker = Worker(log, "w1")
        worker.perform("op-done", KIND, TARGET, {"n": 1}, lambda call: {"id": "m-1"})
        stuck(worker, "op-unknown", State.UNKNOWN)
        stuck(worker, "op-dispatched", State.DISPATCHED)
        project(log, root / "state")
        log.close()
        open_log(f"sqlite:///{root}/other.db").close()
        (root / "garbage.db").write_bytes(b"\x00not a database" * 300)
        (root / "plain").write_text("a file, not a directory")

    def logs(self) -> st.SearchStrategy[str]:
        r = self.root
        return st.one_of(
            st.sampled_from([f"sqlite:///{r}/log.db", "sqlite:///log.db", f"sqlite:///{r}/other.db",
                             f"sqlite:///{r}/garbage.db", f"sqlite:///{r}/no/such/log.db",
                             f"sqlite:///{r}/plain/log.db", "memory://", "sqlite:///",
                             "kafka://127.0.0.1:1?security_protocol=SASL_SSL",
                             "kafka://127.0.0.1:1?bogus=1", "kafka://", "ftp://x"]),
            name.map(lambda n: f"sqlite:///{r}/{n}.db"), junk.filter(lambda s: "://" not in s))

    def states(self) -> st.SearchStrategy[str]:
        r = self.root
        return st.one_of(st.sampled_from([str(r / "state"), "state", str(r / "missing"),
                                          str(r / "plain" / "state"), str(r) + "/" + "s" * 300]),
                         name.map(lambda n: str(r / n)))

    def paths(self) -> st.SearchStrategy[str]:
        return st.one_of(name.map(lambda n: str(self.root / "out" / n)), st.just("-"),
                         st.just("/dev/full"), st.just(str(self.root / "plain" / "x")))


def options(opts: dict[str, st.SearchStrategy[str] | None]) -> st.SearchStrategy[list[str]]:
    """Some of ``opts`` in any order; None marks a flag."""
    def render(chosen: list[str], values: list[str]) -> list[str]:
        out: list[str] = []
        for opt, value in zip(chosen, values, strict=True):
            out += [opt] if opts[opt] is None else [opt, value]
        return out

    return st.lists(st.sampled_from(sorted(opts)), unique=True, max_size=len(opts)).flatmap(
        lambda chosen: st.tuples(*(st.just("") if opts[o] is None else opts[o]
                                   for o in chosen)).map(
            lambda values: render(chosen, list(values))))


def command_lines(world: World) -> st.SearchStrategy[tuple[list[str], str]]:
    """(argv, stdin) for every command."""
    key = mostly(st.sampled_from(KEYS))
    dur = mostly(st.sampled_from(["0s", "5m", "1h"]))
    when = mostly(st.sampled_from(["1h", "2024-05-01T12:00:00Z", "0"]))
    provider = mostly(st.just(f"fake:///{world.root}/provider.db"),
                      st.sampled_from(["nope", "a:b", "http://"])
                      | name.map(lambda n: f"fake:///{world.root}/{n}.db"))
    not_duration = junk.filter(lambda s: not s.strip() or not s.strip()[0].isdigit())
    not_int = junk.filter(lambda s: not s.strip().lstrip("+-").isdigit())
    commands = {
        "append": st.tuples(st.just(["append"]) | options({"--verify": None, "--no-verify": None})
                            .map(lambda o: ["append", *o]),
                            st.lists(request_line(), max_size=4).map(lambda ls: "\n".join(ls))),
        "history": st.tuples(st.tuples(key, options({"--json": None})).map(
            lambda t: ["history", t[0], *t[1]]), st.just("")),
        "get": st.tuples(st.tuples(key, options({"--json": None})).map(
            lambda t: ["get", t[0], *t[1]]), st.just("")),
        "list": st.tuples(options({"--state": st.sampled_from([s.value for s in State]) | junk,
                                   "--older-than": dur, "--limit": junk | st.just("5"),
                                   "--json": None}).map(lambda o: ["list", *o]), st.just("")),
        "stats": st.tuples(options({"--json": None}).map(lambda o: ["stats", *o]), st.just("")),
        "replay": st.tuples(options({"--key": key, "--since": when, "--until": when,
                                     "--format": st.sampled_from(["jsonl", "avro"]) | junk,
                                     "--json": None}).map(lambda o: ["replay", *o]), st.just("")),
        "replay-out": st.tuples(st.tuples(world.paths(), options({"--format": st.sampled_from(
            ["jsonl", "avro"])})).map(lambda t: ["replay", "--out", t[0], *t[1]]), st.just("")),
        "project": st.tuples(options({"--batch-size": junk | st.just("10"), "--quiet": None,
                                      "--decoder": st.sampled_from(["inline", "auto"]) | junk})
                             .map(lambda o: ["project", "--once", *o]), st.just("")),
        "rebuild": st.tuples(options({"--quiet": None, "--decoder": st.just("inline") | junk})
                             .map(lambda o: ["rebuild", *o]), st.just("")),
        "recover": st.tuples(options({"--stuck-after": dur, "--command-timeout": dur,
                                      "--kind-deadline": junk, "--json": None})
                             .map(lambda o: ["recover", "--once", *o]), st.just("")),
        "reconcile": st.tuples(st.tuples(provider, options({"--worker-id": junk | name,
                                                            "--auto-retry": junk, "--json": None}))
                               .map(lambda t: ["reconcile", "--once", "--provider", t[0], *t[1]]),
                               st.just("")),
        "approve": st.tuples(st.tuples(key, st.sampled_from(["retry", "abandon"]) | junk,
                                       junk | name, junk | name).map(
            lambda t: ["approve", t[0], "--decision", t[1], "--by", t[2], "--reason", t[3]]),
            st.just("")),
        "topics": st.tuples(st.just(["topics", "create"]) | junk.map(lambda j: ["topics", j]),
                            st.just("")),
        "serve": st.tuples(not_duration.map(lambda j: ["serve", "--poll", j]) | not_int.map(
            lambda j: ["serve", "--metrics-port", j]), st.just("")),
        "fake-provider": st.tuples(not_int.map(lambda j: ["fake-provider", "serve", "--port", j,
                                                          "--db", "x.db"]), st.just("")),
        "demo": st.tuples(not_int.map(lambda j: ["demo", "--operations", j]), st.just("")),
        "nonsense": st.tuples(st.lists(junk, min_size=1, max_size=3), st.just("")),
    }
    prefix = options({"--log": mostly(st.just(f"sqlite:///{world.root}/log.db"), world.logs()),
                      "--state": mostly(st.just(str(world.root / "state")), world.states()),
                      "--log-level": mostly(st.sampled_from(["warning", "info", "debug"]))})
    return st.sampled_from(sorted(commands)).flatmap(
        lambda c: st.tuples(prefix, commands[c])).map(lambda t: ([*t[0], *t[1][0]], t[1][1]))


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    return World(tmp_path_factory.mktemp("fuzz"))


@pytest.fixture
def in_world(world: World, monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    """The world as cwd, no effectlog environment, umask and signal handlers restored."""
    monkeypatch.chdir(world.root)
    for var in ("EFFECTLOG_LOG", "EFFECTLOG_STATE", "EFFECTLOG_LOG_LEVEL", "EFFECTLOG_LOG_JSON"):
        monkeypatch.delenv(var, raising=False)
    umask = os.umask(0o022)
    os.umask(umask)
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    yield world
    os.umask(umask)
    for sig, handler in handlers.items():
        signal.signal(sig, handler)


def files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def run_in_process(argv: list[str], stdin: str) -> tuple[int, str, str]:
    runner = CliRunner()
    with runner.isolation(input=stdin.encode("utf-8", "surrogateescape")) as (out, err, _):
        try:
            run_guarded(cli, argv)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        return code, out.getvalue().decode("utf-8", "replace"), \
            err.getvalue().decode("utf-8", "replace")  # type: ignore[union-attr]


def check(argv: list[str], code: int, out: str, err: str, created: set[str]) -> None:
    shown = f"{argv!r:.300} -> {code}: {err[-500:]}"
    assert "Traceback" not in out + err, shown
    assert code in (0, 1, 2, 3, 4), shown
    assert "internal error" not in err, shown
    assert sum(line.startswith("error:") for line in err.splitlines()) <= 1, shown
    command = next((a for a in argv if a in READS), None)
    if command is not None and "--out" not in argv and created:
        pytest.fail(f"read command {shown} created {sorted(created)[:5]}")


#: ``EFFECTLOG_FUZZ_EXAMPLES=3000`` explores further (and at random); ``make test`` runs the
#: same 300 examples every time.
EXAMPLES = int(os.environ.get("EFFECTLOG_FUZZ_EXAMPLES", "300"))


@settings(max_examples=EXAMPLES, deadline=None, derandomize=EXAMPLES <= 300,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.data_too_large])
@given(data=st.data())
def test_fuzzed_command_lines_never_crash(in_world: World, data: st.DataObject) -> None:
    argv, stdin = data.draw(command_lines(in_world), label="command line")
    before = files(in_world.root)
    code, out, err = run_in_process(argv, stdin)
    event(f"{next((a for a in argv if a in COMMAND_NAMES), '?')} exit {code}")
    check(argv, code, out, err, files(in_world.root) - before)


@settings(max_examples=25, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.data_too_large])
@given(data=st.data())
def test_fuzzed_command_lines_through_the_console_script(in_world: World,
                                                         data: st.DataObject) -> None:
    argv, stdin = data.draw(command_lines(in_world), label="command line")
    if any("\x00" in a for a in argv):
        argv = [a.replace("\x00", "") for a in argv]  # exec cannot pass NUL in an argument
    before = files(in_world.root)
    done = subprocess.run([str(EFFECTLOG), *argv], input=stdin.encode("utf-8", "surrogateescape"),
                          capture_output=True, cwd=in_world.root, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "COLUMNS": "120"})
    check(argv, done.returncode, done.stdout.decode("utf-8", "replace"),
          done.stderr.decode("utf-8", "replace"), files(in_world.root) - before)
