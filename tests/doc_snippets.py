"""The code blocks of README.md and the docs site, and how a test runs one alone.

Conventions the pages follow (docs/reference/development.md says them for writers):

- every fenced block names its language;
- a ``python`` block runs alone, in a fresh namespace and a scratch directory; its ``#> ``
  comment lines are exactly what it must print;
- a ``console`` block is a shell session run alone in a scratch directory: ``$ `` lines are
  commands (a line ending in ``\\`` continues), the lines after one are its output (stdout and
  stderr), compared with runs of blanks collapsed; ``…`` stands for any text in a line, and a
  line of ``…`` alone for any number of lines;
- ``text`` blocks are illustrations (figures of a real run, commands that need a cluster);
- an HTML comment ``<!-- test: kafka … -->`` just before a block means it needs a broker and a
  ``serve`` instance (``EFFECTLOG_LOG`` and ``EFFECTLOG_SERVER`` are set for it), and
  ``<!-- test: pytest … -->`` that the block is a test module that must pass.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ELLIPSIS = "…"
_FENCE = re.compile(r"^```(\S*)[^\n]*\n(.*?)^```[ \t]*$", re.S | re.M)
_MARK = re.compile(r"<!--\s*test:\s*(\w+)[^>]*-->\s*\n\s*$")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int
    lang: str
    body: str
    mark: str | None

    @property
    def name(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    @property
    def expected(self) -> list[str]:
        """The ``#> `` lines of a python block: what it prints."""
        return re.findall(r"^#> ?(.*)$", self.body, flags=re.M)


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def blocks(paths: list[Path] | None = None) -> Iterator[Block]:
    for path in pages() if paths is None else paths:
        text = path.read_text()
        for m in _FENCE.finditer(text):
            before = text[max(0, m.start() - 300):m.start()]
            mark = _MARK.search(before)
            yield Block(path, text.count("\n", 0, m.start()) + 1, m.group(1), m.group(2),
                        mark.group(1) if mark else None)


def python_blocks(mark: str | None = None) -> list[Block]:
    return [b for b in blocks() if b.lang == "python" and b.mark == mark]


@contextlib.contextmanager
def chdir(path: Path) -> Iterator[None]:
    old = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old)


def run_python(block: Block, where: Path) -> list[str]:
    """Run the block alone in ``where``; the lines it printed."""
    out = io.StringIO()
    with chdir(where), contextlib.redirect_stdout(out):
        exec(compile(block.body, block.name, "exec"), {"__name__": "__doc_snippet__"})
    return out.getvalue().splitlines()


# ---- console blocks ---------------------------------------------------------------------


@dataclass(frozen=True)
class Command:
    command: str
    output: list[str]


def commands(block: Block) -> list[Command]:
    """The ``$ `` commands of a console block with the output shown after each."""
    found: list[Command] = []
    lines = block.body.splitlines()
    i = 0
    while i < len(lines):
        if not lines[i].startswith("$ "):
            raise ValueError(f"{block.name}: output before any command: {lines[i]!r}")
        command = lines[i][2:]
        while command.endswith("\\") and i + 1 < len(lines):
            i += 1
            command = command + "\n" + lines[i]  # bash joins backslash-newline
        i += 1
        output: list[str] = []
        while i < len(lines) and not lines[i].startswith("$ "):
            output.append(lines[i])
            i += 1
        found.append(Command(command, output))
    return found


def _norm(line: str) -> str:
    return " ".join(line.split())


def _line_matches(pattern: str, line: str) -> bool:
    parts = [re.escape(p) for p in _norm(pattern).split(ELLIPSIS)]
    return re.fullmatch(".*".join(parts), _norm(line)) is not None


def output_matches(expected: list[str], actual: list[str]) -> bool:
    """``actual`` fits ``expected``: ``…`` is any text in a line, a ``…`` line any lines."""
    exp = [e for e in expected if e.strip()]
    act = [a for a in actual if a.strip()]

    def fits(i: int, j: int) -> bool:
        if i == len(exp):
            return j == len(act)
        if _norm(exp[i]) == ELLIPSIS:
            return any(fits(i + 1, k) for k in range(j, len(act) + 1))
        return j < len(act) and _line_matches(exp[i], act[j]) and fits(i + 1, j + 1)

    return fits(0, 0)


def shell_env() -> dict[str, str]:
    """The environment a console block runs in: this venv's ``effectlog`` first on PATH,
    the CLI's defaults (no EFFECTLOG_* from the caller)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("EFFECTLOG_")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def run_command(command: str, where: Path, timeout_s: float = 120.0) -> list[str]:
    """Run one command of a console block in bash; its stdout and stderr lines."""
    done = subprocess.run(["bash", "-c", f"set -o pipefail\n{command}"], cwd=where,
                          env=shell_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=timeout_s, check=False)
    if done.returncode != 0:
        raise AssertionError(f"exit {done.returncode}: {command}\n{done.stdout}")
    return done.stdout.splitlines()
