"""``--state`` is only ever a projection: whatever else it names is refused, never taken over.

A regular file, or a directory holding anything a projection never holds, is refused by every
command with one line and exit 2 before anything is written, moved or deleted; an empty
directory is accepted as a new projection, and pruning after a rebuild removes only the
generations effectlog made.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from effectlog.codec import event_codec
from effectlog.log import open_log
from effectlog.log.base import EVENTS
from effectlog.machine import advance, new_effect
from effectlog.model import Transition
from projections.rocksdb import layout

EFFECTLOG = Path(sys.executable).with_name("effectlog")
KEY = "agent:op-0:email.send:mailto:a@example.com"


def write_log(path: Path, count: int = 3) -> None:
    """A SQLite log with ``count`` reserved effects."""
    log = open_log(f"sqlite:///{path}")
    codec = event_codec()
    for n in range(count):
        created = new_effect(f"op-{n}", "email.send", "mailto:a@example.com", {"n": n}, "w1")
        reserved = advance(created, Transition.RESERVE, "w1")
        log.append_many(EVENTS, [(created.idempotency_key, codec.encode(e.to_record()))
                                 for e in (created, reserved)])
    log.close()


def cli(tmp: Path, state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(EFFECTLOG), "--log", f"sqlite:///{tmp}/log.db", "--state",
                           str(state), *args], capture_output=True, text=True, cwd=tmp,
                          timeout=60, input="")


def tree(root: Path) -> dict[str, str]:
    """Every entry under ``root``: a file's content digest, a directory, a symlink's target."""
    out = {}
    for path in sorted(root.rglob("*")):
        name = str(path.relative_to(root))
        if path.is_symlink():
            out[name] = f"-> {os.readlink(path)}"
        elif path.is_dir():
            out[name] = "dir"
        else:
            out[name] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def refused(done: subprocess.CompletedProcess[str], state: Path) -> None:
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(f"error: --state {state} is not an effectlog projection ("), \
        done.stderr


@pytest.fixture
def logged(tmp_path: Path) -> Path:
    write_log(tmp_path / "log.db")
    return tmp_path


def foreign_dir(root: Path) -> Path:
    docs = root / "docs"
    docs.mkdir()
    (docs / "thesis.txt").write_text("important\n")
    return docs


def foreign_file(root: Path) -> Path:
    notes = root / "notes"
    notes.write_text("my notes\n")
    return notes


COMMANDS = [("project", "--once", "--quiet"), ("rebuild", "--quiet"), ("get", KEY),
            ("get", KEY, "--no-catch-up"), ("list",), ("stats",),
            ("approve", KEY, "--decision", "abandon", "--by", "ops", "--reason", "test"),
            ("expire", "--older-than", "1h", "--dry-run"), ("recover", "--once"),
            ("serve", "--no-recovery", "--http", "127.0.0.1:0")]


@pytest.mark.parametrize("make", [foreign_dir, foreign_file], ids=["directory", "file"])
@pytest.mark.parametrize("args", COMMANDS,
                         ids=lambda a: " ".join(x for x in a[:2] if not x.startswith("agent:")))
def test_every_command_refuses_a_state_that_is_not_a_projection(
        logged: Path, make: object, args: tuple[str, ...]) -> None:
    assert callable(make)
    state = make(logged)
    before = tree(logged)
    refused(cli(logged, state, *args), state)
    assert tree(logged) == before


def test_repeated_rebuilds_never_move_or_delete_a_directory_of_other_files(logged: Path) -> None:
    """The auditor's case: three rebuilds onto ``docs/`` deleted ``docs/thesis.txt``."""
    docs = foreign_dir(logged)
    before = tree(logged)
    for _ in range(3):
        refused(cli(logged, docs, "rebuild", "--quiet"), docs)
    assert (docs / "thesis.txt").read_text() == "important\n"
    assert tree(logged) == before


def test_a_regular_file_is_named_as_such(logged: Path) -> None:
    notes = foreign_file(logged)
    done = cli(logged, notes, "project", "--once", "--quiet")
    refused(done, notes)
    assert "a file, not a directory" in done.stderr


def test_a_directory_with_a_stray_file_beside_a_projection_is_refused(logged: Path) -> None:
    """A projection's directory holds ``PARTITIONS`` and ``p-N/`` only: one with the user's
    files in it as well is not taken over (a rebuild would move it aside, then delete it)."""
    state = logged / "plain"
    state.mkdir()
    assert cli(logged, state, "project", "--once", "--quiet").returncode == 0
    (state / "thesis.txt").write_text("important\n")
    before = tree(logged)
    done = cli(logged, state, "rebuild", "--quiet")
    refused(done, state)
    assert "thesis.txt" in done.stderr
    assert tree(logged) == before


def test_a_symlink_to_a_directory_of_other_files_is_refused(logged: Path) -> None:
    docs = foreign_dir(logged)
    link = logged / "state"
    link.symlink_to(docs)
    before = tree(logged)
    refused(cli(logged, link, "project", "--once", "--quiet"), link)
    assert tree(logged) == before


def test_an_empty_directory_becomes_a_projection(logged: Path) -> None:
    state = logged / "empty"
    state.mkdir()
    assert cli(logged, state, "project", "--once", "--quiet").returncode == 0
    assert layout.partitions_in(state) == [0]
    done = cli(logged, state, "get", KEY, "--json", "--no-catch-up")
    assert done.returncode == 0, done.stderr


def test_a_plain_projection_directory_is_still_moved_aside_by_rebuild(logged: Path) -> None:
    state = logged / "plain"
    state.mkdir()
    assert cli(logged, state, "project", "--once", "--quiet").returncode == 0
    for _ in range(3):
        done = cli(logged, state, "rebuild", "--quiet")
        assert done.returncode == 0, done.stderr
    assert state.is_symlink()
    assert len(list(logged.glob("plain.gen-*"))) == 2  # the current one and the one before
    assert cli(logged, state, "get", KEY, "--no-catch-up").returncode == 0


def test_pruning_removes_only_generations_effectlog_made(tmp_path: Path) -> None:
    """Siblings named like a generation but not one (another suffix, a file, a symlink, a
    directory with other files) survive every swap; the real old generations go."""
    state = tmp_path / "state"
    keep = {
        "state.gen-backup": "dir", "state.gen-123": "file", "state.new-9": "symlink",
        "state.gen-77": "foreign dir", "state.genuine": "dir",
    }
    (tmp_path / "state.gen-backup").mkdir()
    (tmp_path / "state.gen-backup" / "a.txt").write_text("a")
    (tmp_path / "state.gen-123").write_text("b")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "c.txt").write_text("c")
    (tmp_path / "state.new-9").symlink_to(tmp_path / "elsewhere")
    (tmp_path / "state.gen-77").mkdir()
    (tmp_path / "state.gen-77" / "d.txt").write_text("d")
    (tmp_path / "state.genuine").mkdir()
    (tmp_path / "state.genuine" / "e.txt").write_text("e")
    finals = [layout.swap_in(state, layout.new_build_dir(state)) for _ in range(4)]
    left = {p.name for p in tmp_path.iterdir()}
    assert set(keep) <= left
    assert (tmp_path / "elsewhere" / "c.txt").read_text() == "c"
    assert {f.name for f in finals[-2:]} <= left and not {f.name for f in finals[:2]} & left


def test_the_layout_refuses_before_making_anything(tmp_path: Path) -> None:
    docs = foreign_dir(tmp_path)
    before = tree(tmp_path)
    for call in (layout.current_generation, layout.ensure_generation, layout.new_build_dir,
                 lambda s: layout.hold(s, "test")):
        with pytest.raises(layout.NotAProjection, match=r"thesis\.txt"):
            call(docs)
    assert tree(tmp_path) == before


def test_a_state_taken_by_other_files_during_a_rebuild_is_not_swapped(logged: Path) -> None:
    """Checked again at the swap: files written into an (empty) state directory while the
    rebuild ran are left where they are, and the build is removed."""
    from projections.rebuild import rebuild

    state = logged / "state"
    state.mkdir()

    def meanwhile(progress: object) -> None:
        (state / "thesis.txt").write_text("important\n")

    log = open_log(f"sqlite:///{logged}/log.db", create=False)
    try:
        with pytest.raises(layout.NotAProjection, match=r"thesis\.txt"):
            rebuild(log, state, on_progress=meanwhile)
    finally:
        log.close()
    assert (state / "thesis.txt").read_text() == "important\n"
    assert not state.is_symlink()
    assert not list(logged.glob("state.new-*")) and not list(logged.glob("state.gen-*"))
