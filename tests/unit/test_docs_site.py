"""The docs site builds in strict mode with no warning, a broken link fails it, and its pages
stay true to the code they describe (the CLI's commands, the state machine's table)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import click
import pytest
import yaml

from effectlog.machine import LEGAL
from effectlog.model import State, Transition
from tests.doc_snippets import ROOT, blocks, pages

pytestmark = pytest.mark.timeout(180)

CONFIG = ROOT / "mkdocs.yml"


def build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                           str(config), "--site-dir", str(site)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=150, check=False)


def nav_pages(nav: Any) -> list[str]:
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, list):
        return [page for item in nav for page in nav_pages(item)]
    if isinstance(nav, dict):
        return [page for value in nav.values() for page in nav_pages(value)]
    return []


def nav() -> list[Any]:
    loaded = yaml.safe_load(CONFIG.read_text())
    assert isinstance(loaded, dict)
    value = loaded["nav"]
    assert isinstance(value, list)
    return value


def test_the_site_builds_strictly_without_a_warning(tmp_path: Path) -> None:
    done = build(CONFIG, tmp_path / "site")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "WARNING" not in done.stdout + done.stderr
    api = (tmp_path / "site" / "reference" / "python-api" / "index.html").read_text()
    assert "effectlog.worker.Worker" in api and "perform" in api  # rendered from docstrings
    console = (tmp_path / "site" / "operate" / "console" / "index.html").read_text()
    assert "console-overview.png" in console
    assert (tmp_path / "site" / "console-overview.png").exists()


@pytest.mark.parametrize("page, extra_nav", [
    ("[the missing page](missing.md)\n", []),
    ("[a missing anchor](#no-such-heading)\n", []),
    ("fine\n", ["missing.md"]),
], ids=["broken link", "broken anchor", "page missing from the nav"])
def test_a_broken_link_or_missing_page_fails_the_strict_build(tmp_path: Path, page: str,
                                                              extra_nav: list[str]) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "index.md").write_text("# Home\n\n" + page)
    config = tmp_path / "mkdocs.yml"
    config.write_text(yaml.safe_dump({"INHERIT": str(CONFIG), "docs_dir": "docs",
                                      "nav": ["index.md", *extra_nav]}))
    done = build(config, tmp_path / "site")
    assert done.returncode != 0
    assert "WARNING" in done.stdout + done.stderr


def test_every_page_is_in_the_nav_and_every_nav_entry_is_a_page() -> None:
    listed = nav_pages(nav())
    on_disk = sorted(p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md"))
    assert sorted(listed) == on_disk


def test_kafka_deployment_decorator_and_exit_codes_are_one_click_from_the_nav() -> None:
    sections = {next(iter(item)): next(iter(item.values())) for item in nav() if isinstance(item, dict)}
    assert "get-started/kafka.md" in nav_pages(sections["Get started"])
    assert "kafka/index.md" in nav_pages(sections["Running on Kafka"])
    assert "agents/decorator.md" in nav_pages(sections["For agent developers"])
    assert "mcp.md" in nav_pages(sections["For agent developers"])
    assert "reference/cli.md" in nav_pages(sections["Reference"])
    assert "\n## Exit codes\n" in (ROOT / "docs" / "reference" / "cli.md").read_text()


def cli_commands() -> list[str]:
    from effectlog.cli.main import cli

    ctx = click.Context(cli)
    names: list[str] = []
    for name in cli.list_commands(ctx):
        command = cli.get_command(ctx, name)
        assert command is not None
        if isinstance(command, click.Group):
            names += [f"{name} {sub}" for sub in command.list_commands(click.Context(command))]
        else:
            names.append(name)
    return names


def test_the_cli_page_names_every_command_and_its_exit_codes() -> None:
    text = (ROOT / "docs" / "reference" / "cli.md").read_text()
    commands_table = text[text.index("## Commands"):text.index("## Exit codes")]
    codes_table = text[text.index("## Exit codes"):]
    for name in cli_commands():
        assert f"| `{name}" in commands_table, name
        assert f"| `{name}" in codes_table, name


def states(cell: str) -> frozenset[State]:
    """``DISPATCHED (re-dispatch, same key)`` -> {DISPATCHED}; ``A (x) / B`` -> {A, B}."""
    plain = re.sub(r"\([^)]*\)", "", cell)
    return frozenset(State(part.strip()) for part in plain.split("/") if part.strip())


def test_the_state_machine_page_shows_exactly_the_legal_table() -> None:
    text = (ROOT / "docs" / "concepts" / "state-machine.md").read_text()
    rows = [line.strip().strip("|").split("|") for line in text.splitlines()
            if line.startswith("| ") and "---" not in line]
    header, body = rows[0], rows[1:]
    transitions = [Transition(cell.strip()) for cell in header[1:]]
    shown: dict[tuple[State | None, Transition], frozenset[State]] = {(None, Transition.CREATE):
                                                                      frozenset({State.CREATED})}
    for cells in body:
        if cells[0].strip() not in State.__members__:
            break  # the next table (rejection reasons)
        for transition, cell in zip(transitions, cells[1:], strict=True):
            if cell.strip():
                shown[(State(cells[0].strip()), transition)] = states(cell)
    assert shown == LEGAL


def test_every_fence_names_its_language_and_output_is_tested_or_illustrative() -> None:
    langs = {(b.path.relative_to(ROOT).as_posix(), b.line): b.lang for b in blocks()}
    assert all(langs.values()), [where for where, lang in langs.items() if not lang]
    for block in blocks():
        if block.lang == "sh":  # commands only: output is shown in console (tested) or text
            assert not re.search(r"^(\$|#>) ", block.body, flags=re.M), block.name


def test_the_readme_is_short_starts_with_the_two_commands_and_links_resolve() -> None:
    text = (ROOT / "README.md").read_text()
    lines = text.splitlines()
    assert len(lines) <= 200
    top = "\n".join(lines[:10])
    assert "make demo" in top and "make test" in top
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    local = [link for link in links if "://" not in link]
    assert local, "the README links into the docs"
    for link in local:
        assert (ROOT / link).exists(), link
    assert all(p.exists() for p in pages())
