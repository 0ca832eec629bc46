"""Faults around the CLI: OS errors, concurrent rebuilds, huge arguments, broken pipes.
Each ends with one line and a documented exit code, never a traceback."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from effectlog.codec import event_codec
from effectlog.log import open_log
from effectlog.log.base import EVENTS
from effectlog.machine import advance, new_effect
from effectlog.model import Outcome, State, Transition
from projections.projector import project
from projections.rocksdb.digest import projection_digest

EFFECTLOG = Path(sys.executable).with_name("effectlog")
KEY = "agent:op-0:email.send:mailto:a@example.com"


def cli(*args: str, cwd: Path, stdout: int | None = None,
        prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*prefix, str(EFFECTLOG), *args], cwd=cwd, text=True, timeout=120,
                          stdout=stdout if stdout is not None else subprocess.PIPE,
                          stderr=subprocess.PIPE, input="")


def one_line(done: subprocess.CompletedProcess[str], code: int, text: str) -> None:
    assert done.returncode == code, done.stderr
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("error:"), done.stderr
    assert text in done.stderr


def write_effects(url: str, count: int) -> None:
    """``count`` whole effects (4 events each), written in big appends: a log worth a
    second of rebuilding, made in a fraction of that."""
    log = open_log(url)
    codec = event_codec()
    items = []
    for n in range(count):
        created = new_effect(f"op-{n}", "email.send", "mailto:a@example.com", {"n": n}, "w1")
        reserved = advance(created, Transition.RESERVE, "w1")
        dispatched = advance(reserved, Transition.DISPATCH, "w1")
        recorded = advance(dispatched, Transition.RECORD, "w1",
                           outcome=Outcome(State.SUCCEEDED, {"n": n}))
        items += [(created.idempotency_key, codec.encode(e.to_record()))
                  for e in (created, reserved, dispatched, recorded)]
    for start in range(0, len(items), 5000):
        log.append_many(EVENTS, items[start:start + 5000])
    log.close()


@pytest.fixture
def projected(tmp_path: Path) -> Path:
    write_effects(f"sqlite:///{tmp_path}/log.db", 3)
    project(open_log(f"sqlite:///{tmp_path}/log.db"), tmp_path / "state")
    return tmp_path


@pytest.mark.parametrize("args", [("get", KEY), ("list",), ("stats",), ("project", "--once"),
                                  ("rebuild",)], ids=lambda a: a[0])
def test_a_state_path_too_long_for_the_system_exits_2(projected: Path, args: tuple[str, ...]) -> None:
    done = cli("--log", f"sqlite:///{projected}/log.db", "--state", "s" * 5000, *args,
               cwd=projected)
    one_line(done, 2, "File name too long")


def test_a_state_path_through_a_file_exits_2(projected: Path) -> None:
    (projected / "plain").write_text("x")
    done = cli("--state", str(projected / "plain" / "state"), "get", KEY, cwd=projected)
    assert done.returncode == 2 and done.stderr.count("\n") == 1


@pytest.mark.parametrize("args", [("get", KEY), ("list",), ("stats",)], ids=lambda a: a[0])
def test_an_unreadable_state_directory_exits_4(projected: Path, args: tuple[str, ...]) -> None:
    """As root, permission checks apply only without CAP_DAC_OVERRIDE: setpriv drops it."""
    no_override: tuple[str, ...] = ()
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("running as root without setpriv: permissions are not checked")
        no_override = ("setpriv", "--bounding-set=-dac_override,-dac_read_search")
    state = projected / "locked"
    state.mkdir(mode=0o000)
    try:
        done = cli("--log", f"sqlite:///{projected}/log.db", "--state", str(state), *args,
                   cwd=projected, prefix=no_override)
    finally:
        state.chmod(0o700)
    one_line(done, 4, "Permission denied")


def test_stdout_on_a_full_device_exits_4(projected: Path) -> None:
    with open("/dev/full", "w") as full:
        done = cli("--log", f"sqlite:///{projected}/log.db", "--state", str(projected / "state"),
                   "history", KEY, "--json", cwd=projected, stdout=full.fileno())
    one_line(done, 4, "No space left on device")


@pytest.mark.parametrize("command", ["replay", "list", "stats", "history " + KEY])
def test_a_closed_pipe_ends_quietly_by_sigpipe_as_unix_tools_do(tmp_path: Path,
                                                                  command: str) -> None:
    """Lines and tables alike (rich's console would end a table quietly with status 1)."""
    write_effects(f"sqlite:///{tmp_path}/log.db", 300)
    project(open_log(f"sqlite:///{tmp_path}/log.db"), tmp_path / "state")
    shell = (f"{EFFECTLOG} --log sqlite:///{tmp_path}/log.db --state {tmp_path}/state "
             f"{command} 2>{tmp_path}/err | head -c 10 >/dev/null; exit ${{PIPESTATUS[0]}}")
    done = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, timeout=60)
    assert done.returncode == 128 + 13, (tmp_path / "err").read_text()  # like `cat big | head`
    assert (tmp_path / "err").read_text() == ""


@pytest.mark.parametrize("args", [
    ("replay", "--since", "1" * 16384), ("replay", "--until", "9" * 5000 + "h"),
    ("list", "--older-than", "7" * 100_000 + "s"), ("recover", "--once", "--stuck-after", "1" * 5000),
    ("get", "agent:" + "x" * 100_000), ("--log", "sqlite:///" + "d/" * 50_000 + "log.db", "stats"),
], ids=["since-digits", "until-digits", "older-than", "stuck-after", "mega-key", "mega-log"])
def test_huge_arguments_get_a_short_error(projected: Path, args: tuple[str, ...]) -> None:
    done = cli("--state", str(projected / "state"), *args, cwd=projected)
    assert done.returncode == 2, done.stderr[:500]
    assert done.stderr.count("\n") == 1 and len(done.stderr) < 1000


@pytest.mark.timeout(180)
def test_two_concurrent_rebuilds_never_crash_and_leave_a_clean_projection(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/log.db"
    write_effects(url, 4000)  # 16,000 events: each rebuild runs for a while
    project(open_log(url), tmp_path / "state")
    args = [str(EFFECTLOG), "--log", url, "--state", str(tmp_path / "state"), "rebuild",
            "--quiet", "--decoder", "inline"]
    procs = [subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    results = [(p.wait(150), p.communicate()[1]) for p in procs]
    codes = sorted(code for code, _ in results)
    assert codes in ([0, 0], [0, 4]), results
    for code, err in results:
        assert "Traceback" not in err
        if code == 4:
            assert err.count("\n") == 1 and "in use by effectlog rebuild" in err
    project(open_log(url), tmp_path / "clean")
    assert projection_digest(tmp_path / "state") == projection_digest(tmp_path / "clean")
