"""Directories holding the log and the projection are private (0700) whatever the umask."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from effectlog.log import open_log


@pytest.fixture
def open_umask() -> Iterator[None]:
    old = os.umask(0)
    yield
    os.umask(old)


def mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def test_sqlite_log_directory_is_0700_even_with_umask_0(tmp_path: Path, open_umask: None) -> None:
    open_log(f"sqlite:///{tmp_path}/private/log.db").close()
    assert mode(tmp_path / "private") == 0o700


def test_projection_generations_are_0700_even_with_umask_0(tmp_path: Path, open_umask: None) -> None:
    layout = pytest.importorskip("projections.rocksdb.layout")
    state = tmp_path / "state"
    generation = layout.ensure_generation(state)
    assert mode(generation) == 0o700
    assert mode(layout.new_build_dir(state)) == 0o700
