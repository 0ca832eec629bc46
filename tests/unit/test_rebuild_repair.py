"""``effectlog rebuild`` repairs a projection it cannot read; other commands point at it.

Before a rebuild reads the current projection's claims (the log it was built from, to say when
the rebuild adopts another one). A damaged projection used to stop the very command that
replaces it; now it is rebuilt from the log, with one WARNING saying what was not known.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.test_state_dir_safety import KEY, write_log

EFFECTLOG = Path(sys.executable).with_name("effectlog")


def cli(tmp: Path, *args: str, log: str = "log.db") -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(EFFECTLOG), "--log", f"sqlite:///{tmp}/{log}", "--state",
                           str(tmp / "state"), *args], capture_output=True, text=True, cwd=tmp,
                          timeout=60, input="")


@pytest.fixture
def damaged(tmp_path: Path) -> Path:
    """A projection built twice (so a live and an earlier generation exist) whose live
    generation's partition has a garbage CURRENT file."""
    write_log(tmp_path / "log.db")
    for _ in range(2):
        assert cli(tmp_path, "rebuild", "--quiet").returncode == 0
    for current in tmp_path.glob("state.gen-*/p-0/CURRENT"):
        current.write_text("garbage\n")
    return tmp_path


def test_rebuild_replaces_a_projection_it_cannot_read(damaged: Path) -> None:
    live = (damaged / "state").resolve()
    done = cli(damaged, "rebuild", "--quiet")
    assert done.returncode == 0, done.stderr
    warnings = [line for line in done.stderr.splitlines() if "WARNING" in line]
    assert len(warnings) == 1, done.stderr
    assert "could not be read" in warnings[0] and "Corruption" in warnings[0]
    assert "change of log is not reported" in warnings[0]
    assert (damaged / "state").resolve() != live
    shown = cli(damaged, "get", KEY, "--no-catch-up")
    assert shown.returncode == 0, shown.stderr


@pytest.mark.parametrize("args", [("get", KEY), ("list",), ("stats",), ("project", "--once")],
                         ids=lambda a: a[0])
def test_other_commands_on_a_damaged_projection_suggest_rebuild(damaged: Path,
                                                                 args: tuple[str, ...]) -> None:
    done = cli(damaged, *args)
    assert done.returncode == 4, done.stderr
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("error:"), done.stderr
    assert "Corruption" in done.stderr and "`effectlog rebuild`" in done.stderr


def test_a_readable_projection_still_reports_the_log_a_rebuild_adopts(tmp_path: Path) -> None:
    """The claims keep their purpose where they can be read: a rebuild onto another log
    says which log it adopted and which one the projection was built from."""
    write_log(tmp_path / "log.db")
    write_log(tmp_path / "other.db", 1)
    assert cli(tmp_path, "rebuild", "--quiet").returncode == 0
    done = cli(tmp_path, "rebuild", "--quiet", log="other.db")
    assert done.returncode == 0, done.stderr
    assert "adopted log" in done.stderr and "(was " in done.stderr
    assert "WARNING" not in done.stderr
