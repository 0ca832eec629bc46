"""The README's "Using effectlog from an agent" examples run as written and print what they say.

Each ```python block of that section runs on its own, in a fresh namespace and a scratch
directory; its ``#> `` comment lines are the output it must print.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"
SECTION = "## Using effectlog from an agent"


def agent_blocks() -> list[str]:
    text = README.read_text()
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    return re.findall(r"```python\n(.*?)```", text[start:end if end > 0 else None], flags=re.S)


def test_the_section_has_the_async_decorator_and_langgraph_examples() -> None:
    blocks = agent_blocks()
    assert len(blocks) == 4
    assert "AsyncWorker" in blocks[0] and "@effectlog.effect" in blocks[1]
    assert "async def charge" in blocks[2] and "langgraph" in blocks[3]


@pytest.mark.parametrize("number", range(4))
def test_agent_example_prints_what_it_says(tmp_path: Path, number: int) -> None:
    block = agent_blocks()[number]
    old = os.getcwd()
    os.chdir(tmp_path)
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(block, "README.md", "exec"), {"__name__": "__readme__"})
    finally:
        os.chdir(old)
    expected = re.findall(r"^#> (.*)$", block, flags=re.M)
    assert expected and out.getvalue().splitlines() == expected
