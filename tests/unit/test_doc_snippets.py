"""Every example of README.md and the docs site runs alone and prints what it says.

Python blocks run in a fresh namespace in a scratch directory, console blocks through bash
with the installed ``effectlog`` script; the conventions are in tests/doc_snippets.py.
The blocks that need a broker run in tests/integration/test_doc_snippets_kafka.py.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.doc_snippets import (
    ROOT,
    Block,
    blocks,
    commands,
    output_matches,
    python_blocks,
    run_command,
    run_python,
)

pytestmark = pytest.mark.timeout(180)

PYTHON = python_blocks()
CONSOLE = [b for b in blocks() if b.lang == "console"]
PYTEST = python_blocks("pytest")


def test_the_examples_people_look_for_are_there_and_print_something() -> None:
    printing = {b.path.relative_to(ROOT).as_posix() for b in PYTHON if b.expected}
    assert {"README.md", "docs/get-started/embedded.md", "docs/agents/worker.md",
            "docs/agents/async-worker.md", "docs/agents/decorator.md",
            "docs/agents/langgraph.md", "docs/concepts/keys.md", "docs/concepts/fencing.md",
            "docs/concepts/unknown.md"} <= printing
    readme = [b for b in PYTHON if b.path.name == "README.md"]
    assert len(readme) == 2 and "Worker(" in readme[0].body and "@effectlog.effect" in readme[1].body
    assert {b.path.name for b in CONSOLE} >= {"embedded.md", "append.md"}
    assert PYTEST and python_blocks("kafka")


def test_only_known_marks_are_used() -> None:
    assert {b.mark for b in blocks()} <= {None, "kafka", "pytest"}


@pytest.mark.parametrize("block", PYTHON, ids=[b.name for b in PYTHON])
def test_python_example_prints_what_it_says(block: Block, tmp_path: Path) -> None:
    printed = run_python(block, tmp_path)
    assert printed == block.expected


@pytest.mark.parametrize("block", CONSOLE, ids=[b.name for b in CONSOLE])
def test_console_session_prints_what_it_says(block: Block, tmp_path: Path) -> None:
    steps = commands(block)
    assert steps
    for step in steps:
        actual = run_command(step.command, tmp_path)
        assert output_matches(step.output, actual), (
            f"$ {step.command}\nexpected:\n" + "\n".join(step.output) + "\ngot:\n" + "\n".join(actual))


@pytest.mark.parametrize("block", PYTEST, ids=[b.name for b in PYTEST])
def test_example_test_module_passes(block: Block, tmp_path: Path) -> None:
    module = tmp_path / "test_example.py"
    module.write_text(block.body)
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "--rootdir", str(tmp_path), str(module)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=150, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert " passed" in done.stdout and "failed" not in done.stdout


def test_output_matching_takes_ellipses_for_any_text_and_any_lines() -> None:
    assert output_matches(["a … c"], ["a  b b  c"])
    assert output_matches(["first", "…"], ["first", "second", "third"])
    assert output_matches(["…", "last"], ["last"])
    assert not output_matches(["first"], ["first", "second"])
    assert not output_matches(["a … c"], ["a b d"])
