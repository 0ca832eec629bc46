"""The console entry answers `get KEY --json` without click; everything else is unchanged."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from effectlog.log import open_log
from effectlog.worker import Worker
from projections.projector import project

KEY = "agent:op-1:email.send:mailto:a@example.com"
ENTRY = "import sys; from effectlog.cli.entry import main; sys.argv[0] = 'effectlog'; main()"


@pytest.fixture
def projected(tmp_path: Path) -> Path:
    log = open_log(f"sqlite:///{tmp_path}/log.db")
    Worker(log, "w1").perform("op-1", "email.send", "mailto:a@example.com", {"s": 1},
                              lambda call: {"id": "m-1"})
    project(log, tmp_path / "state")
    return tmp_path


def entry(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", ENTRY, "--log", f"sqlite:///{tmp}/log.db",
                           "--state", str(tmp / "state"), *args],
                          capture_output=True, text=True, timeout=60)


def test_fast_path_prints_what_the_full_cli_prints(projected: Path) -> None:
    fast = entry(projected, "get", KEY, "--json")
    full = subprocess.run([sys.executable, "-m", "effectlog.cli.main", "--log",
                           f"sqlite:///{projected}/log.db", "--state",
                           str(projected / "state"), "get", KEY, "--json"],
                          capture_output=True, text=True, timeout=60)
    assert fast.returncode == full.returncode == 0
    assert json.loads(fast.stdout) == json.loads(full.stdout)
    assert json.loads(fast.stdout)["state"] == "SUCCEEDED"


def test_fast_path_loads_neither_click_nor_fastavro(projected: Path) -> None:
    code = ("import sys; from effectlog.cli.entry import fast_get_json;"
            f"assert fast_get_json(['--log', 'sqlite:///{projected}/log.db', '--state', "
            f"{str(projected / 'state')!r}, 'get', {KEY!r}, '--json']) == 0;"
            "print('click' in sys.modules, 'fastavro' in sys.modules, 'rich' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "False False False"


@pytest.mark.parametrize(("args", "code"), [
    (("get", "agent:none:k:t", "--json"), 1),   # unknown key: the full CLI's error
    (("get", "--json", KEY), 0),                 # other shapes go to click
    (("get", KEY), 0),                           # the table
    (("get",), 2),
])
def test_other_shapes_and_errors_go_through_the_full_cli(projected: Path, args: tuple[str, ...],
                                                         code: int) -> None:
    done = entry(projected, *args)
    assert done.returncode == code, done.stderr
    if code == 1:
        assert done.stderr.startswith("error: no effect with key")
