"""A short soak on SQLite (`make soak` runs the long one): workers and `serve` SIGKILLed,
recovery until quiet, no duplicate effect, no lost acknowledged event, and a projection
equal to a clean rebuild."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LAST = re.compile(r"soak: (\d+) operations, (\d+) kills, (\d+) duplicate effects, (\d+) lost "
                  r"acknowledged events; the final projection (equals|DIFFERS from) a clean "
                  r"rebuild")

pytestmark = [pytest.mark.crash, pytest.mark.timeout(300)]


def test_a_short_soak_on_sqlite_loses_nothing_and_duplicates_nothing(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(REPO / "bench" / "soak.py"), "--ops", "120",
                           "--workers", "3", "--seed", "11", "--serve-uptime", "0.4-1.2",
                           "--dir", str(tmp_path / "soak")],
                          capture_output=True, text=True, timeout=280, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-1000:]
    match = LAST.fullmatch(done.stdout.strip().splitlines()[-1])
    assert match is not None, done.stdout
    operations, kills, duplicates, lost, verdict = match.groups()
    assert (operations, duplicates, lost, verdict) == ("120", "0", "0", "equals")
    assert int(kills) > 0
    assert re.search(r"[1-9]\d* serve kills", done.stderr), done.stderr[-2000:]
