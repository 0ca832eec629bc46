"""What effectlog creates is private whatever the umask: directories 0700, files 0600."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from consumers.bookkeeping import CommandLedger, consumer_db_path
from effectlog.log import open_log
from projections.projector import project
from projections.rocksdb import layout

EFFECTLOG = Path(sys.executable).with_name("effectlog")


@pytest.fixture
def open_umask() -> Iterator[None]:
    old = os.umask(0)
    yield
    os.umask(old)


def mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def modes(root: Path) -> dict[str, int]:
    """The mode of everything under ``root`` (symlinks themselves skipped)."""
    return {str(p.relative_to(root)): mode(p) for p in sorted(root.rglob("*"))
            if not p.is_symlink()}


def test_sqlite_log_directories_and_file_are_private_even_with_umask_0(tmp_path: Path,
                                                                       open_umask: None) -> None:
    open_log(f"sqlite:///{tmp_path}/private/deeper/log.db").close()
    assert mode(tmp_path / "private") == mode(tmp_path / "private" / "deeper") == 0o700
    assert mode(tmp_path / "private" / "deeper" / "log.db") == 0o600


def test_projection_generations_are_0700_even_with_umask_0(tmp_path: Path, open_umask: None) -> None:
    state = tmp_path / "a" / "state"
    generation = layout.ensure_generation(state)
    assert mode(generation) == mode(tmp_path / "a") == 0o700
    assert mode(layout.new_build_dir(state)) == 0o700


def test_library_bookkeeping_and_partition_directories_are_private(tmp_path: Path,
                                                                   open_umask: None) -> None:
    log = open_log(f"sqlite:///{tmp_path}/log.db")
    project(log, tmp_path / "state")
    CommandLedger(consumer_db_path(tmp_path / "state", "recovery")).close()
    generation = layout.current_generation(tmp_path / "state")
    assert generation is not None and mode(generation / "p-0") == 0o700
    assert mode(tmp_path / "state.consumers") == 0o700
    assert mode(tmp_path / "state.consumers" / "recovery.db") == 0o600


@pytest.mark.parametrize("umask", [0o000, 0o022])
def test_everything_the_cli_creates_is_0700_or_0600(tmp_path: Path, umask: int) -> None:
    """append, project, recover, reconcile and replay --out, from a shell with a lax umask."""
    root = tmp_path / "work"
    root.mkdir()
    line = json.dumps({"operation_id": "op-1", "kind": "email.send",
                       "target": "mailto:a@example.com", "payload": {}, "transition": "create",
                       "worker_id": "w1"}) + "\n"
    base = [str(EFFECTLOG), "--log", "sqlite:///.effectlog/log.db"]
    steps = [(["append"], line), (["project", "--once"], ""),
             (["recover", "--once", "--stuck-after", "0s"], ""),
             (["reconcile", "--once", "--provider", "fake://.effectlog/provider.db"], ""),
             (["replay", "--out", ".effectlog/a.jsonl"], "")]
    for args, stdin in steps:
        done = subprocess.run([*base, *args], input=stdin, capture_output=True, text=True,
                              cwd=root, timeout=60,
                              preexec_fn=lambda: os.umask(umask))
        assert done.returncode == 0, (args, done.stderr)
    assert mode(root / ".effectlog") == 0o700
    found = modes(root / ".effectlog")
    assert found, "nothing was created"
    wrong = {path: oct(m) for path, m in found.items()
             if m != (0o700 if (root / ".effectlog" / path).is_dir() else 0o600)}
    assert wrong == {}
    assert {"log.db", "state.consumers/recovery.db", "a.jsonl", "provider.db"} <= set(found)
