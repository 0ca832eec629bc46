"""How ``effectlog serve`` exits when one of its loops dies: 4 with one line naming the loop
and the cause when it died of its backend, 1 (an internal error) otherwise; never 2, which
means bad usage. The mapping itself, and a real ``serve`` process on SQLite whose recovery
loop is made to die."""

from __future__ import annotations

import errno
import subprocess
import sys
from pathlib import Path

import pytest

from effectlog.cli.serve_command import stop_error
from effectlog.errors import BackendUnavailable, WrongLog

pytestmark = pytest.mark.timeout(60)
UNREACHABLE = "kafka broker 127.0.0.1:9 unreachable: no end offsets"


def test_a_loop_dead_of_its_backend_is_exit_4_naming_the_loop_and_the_cause() -> None:
    error = stop_error([("projector", BackendUnavailable(UNREACHABLE))])
    assert error is not None and error.exit_code == 4
    assert str(error) == f"the projector loop stopped: {UNREACHABLE}"
    wrong = stop_error([("recovery", WrongLog("events topic replaced"))])
    assert wrong is not None and wrong.exit_code == 4
    full = stop_error([("recovery", OSError(errno.ENOSPC, "No space left on device", "/s/x"))])
    assert full is not None and full.exit_code == 4
    assert str(full) == "the recovery loop stopped: No space left on device: /s/x"
    rocks = stop_error([("projector", Exception("IO error: lock hold"))])
    assert rocks is not None and rocks.exit_code == 4
    assert str(rocks) == "the projector loop stopped: projection storage error: IO error: lock hold"


def test_any_other_crash_is_an_internal_error_exit_1() -> None:
    error = stop_error([("reconciler", KeyError("state")),
                        ("recovery", BackendUnavailable(UNREACHABLE))], running=["metrics"])
    assert error is not None and error.exit_code == 1
    assert str(error) == ("internal error: the reconciler loop crashed: KeyError: 'state' "
                          "(then the recovery loop(s) too); the metrics loop(s) did not stop "
                          "in time")
    hung = stop_error([], running=["projector"])
    assert hung is not None and hung.exit_code == 1
    assert str(hung) == "internal error: the projector loop(s) did not stop in time"
    assert stop_error([]) is None


SERVE_WITH_A_DYING_LOOP = """
import sys
import consumers.recovery
from effectlog.errors import BackendUnavailable

def dies(self, stop):
    raise {raise_}

consumers.recovery.RecoveryConsumer.run = dies
sys.argv[0] = "effectlog"
from effectlog.cli.main import main
main()
"""


@pytest.mark.parametrize(("raise_", "code", "line"), [
    (f"BackendUnavailable({UNREACHABLE!r})", 4,
     f"error: the recovery loop stopped: {UNREACHABLE}"),
    ("ValueError('bad state')", 1,
     "error: internal error: the recovery loop crashed: ValueError: bad state"),
])
def test_serve_exits_with_the_code_of_the_loop_that_died(tmp_path: Path, raise_: str, code: int,
                                                         line: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", SERVE_WITH_A_DYING_LOOP.format(raise_=raise_),
         "--log", f"sqlite:///{tmp_path}/log.db", "--state", str(tmp_path / "state"),
         "--log-level", "WARNING", "serve", "--http", "127.0.0.1:0",
         "--provider", f"fake:///{tmp_path}/provider.db"],
        capture_output=True, text=True, timeout=50, stdin=subprocess.DEVNULL)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == code, done.stderr[-2000:]
    assert [x for x in lines if not x.startswith("effectlog serve: ")] == [line], done.stderr
