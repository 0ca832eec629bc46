"""The README's worker example runs as written."""

from __future__ import annotations

import contextlib
import io
import os
import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_worker_example_runs_as_written(tmp_path: Path) -> None:
    block = python_blocks()[0]
    old = os.getcwd()
    os.chdir(tmp_path)
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(block, "README.md", "exec"), {"__name__": "__readme__"})
    finally:
        os.chdir(old)
    expected = re.search(r"^# (\[\('CREATE'.*)$", block, flags=re.M)
    assert expected is not None
    assert out.getvalue().strip() == expected.group(1)
