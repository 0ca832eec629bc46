"""Every cell of the CLI exit-code table (docs/reference/cli.md), through the installed console script.

Each test runs ``.venv/bin/effectlog`` as a real process and checks the code, that stderr
holds exactly one ``error:`` line on failure, and that no Python traceback is printed.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from effectlog.log import EVENTS, open_log
from effectlog.model import State
from effectlog.worker import Worker
from projections.projector import project
from projections.rocksdb import layout
from tests.recovery_support import stuck

EFFECTLOG = Path(sys.executable).with_name("effectlog")
OK, NOT_FOUND, USAGE, CONFLICT, UNAVAILABLE = 0, 1, 2, 3, 4
KIND, TARGET = "email.send", "mailto:a@example.com"


@dataclass
class World:
    """A log with one effect per state the commands need, projected."""

    tmp: Path
    done: str
    unknown: str
    dispatched: str

    @property
    def log(self) -> str:
        return f"sqlite:///{self.tmp}/log.db"

    @property
    def state(self) -> Path:
        return self.tmp / "state"

    def run(self, *args: str, stdin: str = "", log: str | None = None,
            state: Path | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return effectlog("--log", log or self.log, "--state", str(state or self.state), *args,
                         stdin=stdin, cwd=self.tmp, timeout=timeout)


def effectlog(*args: str, stdin: str = "", cwd: Path | None = None,
              timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(EFFECTLOG), *args], input=stdin, capture_output=True, text=True,
                          cwd=cwd, timeout=timeout)


def expect(done: subprocess.CompletedProcess[str], code: int, message: str = "") -> None:
    """The exit code, no traceback, and on failure one ``error:`` line naming ``message``."""
    assert done.returncode == code, (done.returncode, done.stderr[-2000:])
    assert "Traceback" not in done.stderr + done.stdout
    if code in (USAGE, UNAVAILABLE) or (code == NOT_FOUND and message):
        errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1, done.stderr
        assert message in errors[0], errors[0]


def line(transition: str, op: str = "op-x", **fields: object) -> str:
    return json.dumps({"operation_id": op, "kind": KIND, "target": TARGET, "worker_id": "w1",
                       "transition": transition, **fields}) + "\n"


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    tmp = tmp_path_factory.mktemp("exit-codes")
    log = open_log(f"sqlite:///{tmp}/log.db")
    worker = Worker(log, "w1")
    worker.perform("op-done", KIND, TARGET, {"n": 1}, lambda call: {"id": "m-1"})
    unknown = stuck(worker, "op-unknown", State.UNKNOWN)
    dispatched = stuck(worker, "op-dispatched", State.DISPATCHED)
    project(log, tmp / "state")
    log.close()
    return World(tmp, f"agent:op-done:{KIND}:{TARGET}", unknown, dispatched)


@pytest.fixture
def fresh(tmp_path: Path) -> World:
    """A world of its own, for tests that change it."""
    log = open_log(f"sqlite:///{tmp_path}/log.db")
    worker = Worker(log, "w1")
    worker.perform("op-done", KIND, TARGET, {"n": 1}, lambda call: {"id": "m-1"})
    unknown = stuck(worker, "op-unknown", State.UNKNOWN)
    dispatched = stuck(worker, "op-dispatched", State.DISPATCHED)
    project(log, tmp_path / "state")
    log.close()
    return World(tmp_path, f"agent:op-done:{KIND}:{TARGET}", unknown, dispatched)


def other_log(tmp: Path) -> str:
    """A log with another identity at a path of its own."""
    url = f"sqlite:///{tmp}/other.db"
    open_log(url).close()
    return url


def missing(tmp: Path) -> str:
    return f"sqlite:///{tmp}/no/such/dir/log.db"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# -- append ---------------------------------------------------------------------------------

def test_append_0_appends(world: World) -> None:
    expect(world.run("append", stdin=line("create", "op-new", payload={"a": 1})), OK)


def test_append_1_transition_on_a_key_without_effect(world: World) -> None:
    expect(world.run("append", stdin=line("reserve", "op-never")), NOT_FOUND, "no effect")


def test_append_2_bad_line(world: World) -> None:
    expect(world.run("append", stdin="{not json\n"), USAGE, "invalid JSON")


def test_append_3_payload_mismatch(world: World) -> None:
    expect(world.run("append", stdin=line("create", "op-done", payload={"n": 2})), CONFLICT)


def test_append_4_log_of_another_identity(world: World, tmp_path: Path) -> None:
    done = world.run("append", stdin=line("create", "op-y", payload={}), log=other_log(tmp_path))
    expect(done, UNAVAILABLE, "was built from log")


# -- history --------------------------------------------------------------------------------

def test_history_0_shows_the_events(world: World) -> None:
    expect(world.run("history", world.done, "--json"), OK)


def test_history_1_unknown_key(world: World) -> None:
    expect(world.run("history", "agent:op-none:email.send:x"), NOT_FOUND, "no events")


def test_history_2_missing_log(world: World, tmp_path: Path) -> None:
    expect(world.run("history", world.done, log=missing(tmp_path)), USAGE,
           f"no sqlite log at {tmp_path}/no/such/dir/log.db")


def test_history_4_damaged_log(world: World, tmp_path: Path) -> None:
    (tmp_path / "bad.db").write_bytes(b"not a database" * 100)
    expect(world.run("history", world.done, log=f"sqlite:///{tmp_path}/bad.db"), UNAVAILABLE,
           "cannot open sqlite log")


# -- replay ---------------------------------------------------------------------------------

def test_replay_0_clean_history(world: World) -> None:
    expect(world.run("replay", "--key", world.done), OK)


def test_replay_1_key_without_events(world: World) -> None:
    expect(world.run("replay", "--key", "agent:op-none:email.send:x"), NOT_FOUND, "no events")


def test_replay_2_bad_time(world: World) -> None:
    expect(world.run("replay", "--since", "9" * 16384), USAGE, "invalid time")


def test_replay_3_violations(tmp_path: Path) -> None:
    log = open_log(f"sqlite:///{tmp_path}/log.db")
    Worker(log, "w1").create("op-1", KIND, TARGET, {"a": 1})
    log.append(EVENTS, f"agent:op-1:{KIND}:{TARGET}", b"garbage")
    log.close()
    done = effectlog("--log", f"sqlite:///{tmp_path}/log.db", "replay", cwd=tmp_path)
    expect(done, CONFLICT)
    assert "violations: 1 (undecodable 1)" in done.stderr


def test_replay_4_output_device_full(world: World) -> None:
    expect(world.run("replay", "--out", "/dev/full"), UNAVAILABLE, "No space left on device")


# -- get, list, stats -----------------------------------------------------------------------

def test_get_0_shows_the_snapshot(world: World) -> None:
    expect(world.run("get", world.done), OK)


def test_get_1_unknown_key(world: World) -> None:
    expect(world.run("get", "agent:op-none:email.send:x", "--json"), NOT_FOUND, "no effect")


def test_get_2_missing_state(world: World, tmp_path: Path) -> None:
    expect(world.run("get", world.done, state=tmp_path / "nope"), USAGE,
           f"no projection at {tmp_path}/nope")
    assert not (tmp_path / "nope").exists()


def test_get_4_damaged_projection(fresh: World) -> None:
    generation = layout.current_generation(fresh.state)
    assert generation is not None
    for path in (generation / "p-0").iterdir():
        if path.name.startswith("MANIFEST"):
            path.write_bytes(b"\x00garbage" * 64)
    expect(fresh.run("get", fresh.done), UNAVAILABLE, "projection")


def test_list_0_lists(world: World) -> None:
    expect(world.run("list", "--json"), OK)


def test_list_2_bad_duration(world: World) -> None:
    expect(world.run("list", "--older-than", "5 parsecs"), USAGE, "invalid duration")


def test_list_4_unreadable_projection(fresh: World) -> None:
    generation = layout.current_generation(fresh.state)
    assert generation is not None
    (generation / "p-0" / "CURRENT").write_text("MANIFEST-999999\n")
    expect(fresh.run("list"), UNAVAILABLE, "projection")


def test_stats_0_shows_figures_with_the_absolute_log_path(world: World) -> None:
    done = effectlog("--log", "sqlite:///log.db", "--state", "state", "stats", "--json",
                     cwd=world.tmp)
    expect(done, OK)
    figures = json.loads(done.stdout)
    assert figures["log"] == f"sqlite:///{world.tmp}/log.db"
    assert figures["projection"] == str(world.state)


def test_stats_2_missing_state(world: World, tmp_path: Path) -> None:
    expect(world.run("stats", state=tmp_path / "nope"), USAGE, "no projection at")


def test_stats_4_log_missing_under_a_state_that_claims_one(world: World, tmp_path: Path) -> None:
    expect(world.run("stats", log=missing(tmp_path)), UNAVAILABLE, "was built from log")
    assert not (tmp_path / "no").exists()


# -- project, rebuild -----------------------------------------------------------------------

def test_project_0_catches_up(world: World) -> None:
    expect(world.run("project", "--once", "--quiet"), OK)


def test_project_2_missing_log_without_state(tmp_path: Path) -> None:
    done = effectlog("--log", missing(tmp_path), "--state", str(tmp_path / "state"), "project",
                     "--once", cwd=tmp_path)
    expect(done, USAGE, "no sqlite log at")
    assert list(tmp_path.iterdir()) == []


def test_project_4_log_of_another_identity(world: World, tmp_path: Path) -> None:
    expect(world.run("project", "--once", log=other_log(tmp_path)), UNAVAILABLE,
           "was built from log")


def test_rebuild_0_swaps_in(fresh: World) -> None:
    expect(fresh.run("rebuild", "--quiet"), OK)


def test_rebuild_2_missing_log(world: World, tmp_path: Path) -> None:
    expect(world.run("rebuild", log=missing(tmp_path)), USAGE, "no sqlite log at")


def test_rebuild_4_while_another_rebuild_runs(fresh: World) -> None:
    with layout.hold(fresh.state, "effectlog rebuild"):
        expect(fresh.run("rebuild", "--quiet"), UNAVAILABLE, "in use by effectlog rebuild")


# -- recover, reconcile, approve ------------------------------------------------------------

def test_recover_0_issues_commands(fresh: World) -> None:
    done = fresh.run("recover", "--once", "--stuck-after", "0s")
    expect(done, OK)
    assert "reconcile agent:op-dispatched" in done.stdout


def test_recover_2_bad_deadline(world: World) -> None:
    expect(world.run("recover", "--once", "--stuck-after", "soon"), USAGE, "invalid duration")


def test_recover_4_without_projection(world: World, tmp_path: Path) -> None:
    expect(world.run("recover", "--once", state=tmp_path / "none"), UNAVAILABLE, "no projection")


def test_reconcile_0_handles_commands(fresh: World) -> None:
    fresh.run("recover", "--once", "--stuck-after", "0s")
    done = fresh.run("reconcile", "--once", "--provider", f"fake:///{fresh.tmp}/provider.db")
    expect(done, OK)
    assert "2 command(s) handled" in done.stdout  # the DISPATCHED and the UNKNOWN effect


def test_reconcile_2_bad_provider(world: World) -> None:
    expect(world.run("reconcile", "--once", "--provider", "nope"), USAGE, "provider")


def test_reconcile_4_log_missing(world: World, tmp_path: Path) -> None:
    expect(world.run("reconcile", "--once", "--provider", f"fake:///{tmp_path}/p.db",
                     log=missing(tmp_path)), UNAVAILABLE, "was built from log")


def test_approve_0_decides(fresh: World) -> None:
    expect(fresh.run("approve", fresh.unknown, "--decision", "abandon", "--by", "ops",
                     "--reason", "checked"), OK)


def test_approve_1_unknown_key(world: World) -> None:
    expect(world.run("approve", "agent:op-none:email.send:x", "--decision", "retry", "--by",
                     "ops", "--reason", "r"), NOT_FOUND, "no effect")


def test_approve_2_bidi_override_in_reason(world: World) -> None:
    expect(world.run("approve", world.unknown, "--decision", "retry", "--by", "ops",
                     "--reason", "ok\u202eevil"), USAGE, "\\u202e")


def test_approve_3_effect_not_in_doubt(world: World) -> None:
    expect(world.run("approve", world.done, "--decision", "retry", "--by", "ops", "--reason",
                     "r"), CONFLICT)


def test_approve_4_log_of_another_identity(world: World, tmp_path: Path) -> None:
    expect(world.run("approve", world.unknown, "--decision", "retry", "--by", "ops",
                     "--reason", "r", log=other_log(tmp_path)), UNAVAILABLE, "was built from")


# -- topics create (Kafka) ------------------------------------------------------------------

def test_topics_create_2_on_a_sqlite_log(world: World) -> None:
    expect(world.run("topics", "create"), USAGE, "Kafka")


def test_topics_create_4_unreachable_broker(tmp_path: Path) -> None:
    done = effectlog("--log", "kafka://127.0.0.1:1?timeout_s=1", "topics", "create",
                     cwd=tmp_path)
    expect(done, UNAVAILABLE)


@pytest.mark.kafka
def test_topics_create_0_and_3_on_a_broker(kafka_bootstrap: str, tmp_path: Path) -> None:
    url = f"kafka://{kafka_bootstrap}?prefix=exit{os.getpid()}{time.time_ns() % 10**6}"
    expect(effectlog("--log", url, "topics", "create", cwd=tmp_path), OK)
    contradicting = url + "&partitions=2"
    expect(effectlog("--log", contradicting, "topics", "create", cwd=tmp_path), CONFLICT)


def test_kafka_sasl_without_mechanism_2(tmp_path: Path) -> None:
    done = effectlog("--log", "kafka://127.0.0.1:1?security_protocol=SASL_SSL", "history",
                     "agent:op:email.send:x", cwd=tmp_path)
    expect(done, USAGE, "needs sasl_mechanism")


# -- serve, fake-provider serve, demo -------------------------------------------------------

def _serve(args: list[str], tmp: Path, ready: str) -> subprocess.CompletedProcess[str]:
    """Start a long-running command, wait for its ``ready`` line on stderr, SIGTERM it."""
    err = tmp / "serve.err"
    with err.open("w") as handle:
        proc = subprocess.Popen([str(EFFECTLOG), *args], stdout=subprocess.DEVNULL,
                                stderr=handle, cwd=tmp)
    deadline = time.monotonic() + 60
    while ready not in err.read_text() and proc.poll() is None:
        assert time.monotonic() < deadline, err.read_text()
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(90)
    return subprocess.CompletedProcess(args, code, "", err.read_text())


def test_serve_0_stops_on_sigterm(fresh: World) -> None:
    done = _serve(["--log", fresh.log, "--state", str(fresh.state), "serve", "--metrics-port",
                   str(free_port()), "--no-recovery"], fresh.tmp, "metrics on")
    expect(done, OK)
    assert "no recovery here (--no-recovery)" in done.stderr
    assert " INFO " in done.stderr and "partition 0 serving" in done.stderr  # serve logs INFO


def test_serve_0_recovers_with_the_provider_named_in_the_environment(
        fresh: World, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EFFECTLOG_PROVIDER", f"fake:///{fresh.tmp / 'provider.db'}")
    done = _serve(["--log", fresh.log, "--state", str(fresh.state), "serve",
                   "--metrics-port", str(free_port())], fresh.tmp, "metrics on")
    expect(done, OK)
    assert "recovery and reconciler for the partitions it owns, provider fake:///" in done.stderr


def test_serve_2_bad_poll(world: World) -> None:
    expect(world.run("serve", "--poll", "often", "--no-recovery"), USAGE, "invalid duration")


def test_serve_2_without_a_provider_or_no_recovery(world: World,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EFFECTLOG_PROVIDER", raising=False)
    expect(world.run("serve", "--metrics-port", str(free_port())), USAGE,
           "pass --provider SPEC (or set EFFECTLOG_PROVIDER), or --no-recovery")
    expect(world.run("serve", "--no-recovery", "--provider", "fake:///p.db"), USAGE,
           "--provider and --no-recovery contradict")


def test_serve_4_log_missing(world: World, tmp_path: Path) -> None:
    expect(world.run("serve", "--metrics-port", str(free_port()), "--no-recovery",
                     log=missing(tmp_path)), UNAVAILABLE, "was built from log")


def test_fake_provider_serve_0_stops_on_sigterm(tmp_path: Path) -> None:
    done = _serve(["fake-provider", "serve", "--port", str(free_port()), "--db",
                   str(tmp_path / "fake.db")], tmp_path, "fake provider on")
    expect(done, OK)


def test_fake_provider_serve_2_bad_port(tmp_path: Path) -> None:
    expect(effectlog("fake-provider", "serve", "--port", "eighty", "--db", "x.db", cwd=tmp_path),
           USAGE, "port")


@pytest.mark.timeout(240)
def test_demo_0_small_run(tmp_path: Path) -> None:
    done = effectlog("--log", f"sqlite:///{tmp_path}/demo/log.db", "--state",
                     str(tmp_path / "demo" / "state"), "demo", "--operations", "8", "--workers",
                     "2", "--crash-rate", "0", "--json", cwd=tmp_path, timeout=200)
    expect(done, OK)


def test_demo_2_refuses_to_delete_files_it_did_not_make(tmp_path: Path) -> None:
    (tmp_path / "log.db").write_text("mine")
    done = effectlog("--log", f"sqlite:///{tmp_path}/log.db", "--state", str(tmp_path / "s"),
                     "demo", cwd=tmp_path)
    expect(done, USAGE, "refusing to delete")
    assert (tmp_path / "log.db").read_text() == "mine"


def test_demo_1_when_effectlog_caused_a_duplicate(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """No test can make effectlog cause a duplicate (that is the point), so this cell runs
    in-process with the run's figures replaced: the exit code path itself is real."""
    from dataclasses import replace

    from effectlog.cli.demo import run as demo_run
    from effectlog.cli.main import main

    real = demo_run.run_demo

    def duplicated(*args: object, **kwargs: object) -> demo_run.DemoResult:
        result = real(*args, **kwargs)  # type: ignore[arg-type]
        return replace(result, effectlog=replace(result.effectlog, duplicate_effects=1))

    monkeypatch.setattr(demo_run, "run_demo", duplicated)
    umask = os.umask(0o022)
    try:
        with pytest.raises(SystemExit) as exit_info:
            main(["--log", f"sqlite:///{tmp_path}/log.db", "--state", str(tmp_path / "s"),
                  "demo", "--operations", "3", "--workers", "1", "--crash-rate", "0", "--json"])
    finally:
        os.umask(umask)  # the CLI sets 077 for the process it runs in
    assert exit_info.value.code == NOT_FOUND


def test_unknown_command_2(tmp_path: Path) -> None:
    expect(effectlog("no-such-command", cwd=tmp_path), USAGE)

