"""On-disk layout of a projection: generations behind one symlink, one RocksDB per partition.

``state_dir`` is a symlink to the current generation directory ``<state_dir>.gen-<ms>``,
which holds ``p-<N>/`` (one RocksDB per partition of the events topic). A rebuild fills
``<state_dir>.new-<ms>``, renames it to a generation and swaps the symlink with
``os.replace``: readers that open after the swap see the new projection, readers that
opened before keep the old one, which is kept until the next rebuild. ``PARTITIONS`` in a
generation records how many partitions the events topic has, so a reader can compute a
key's partition even where only some partitions are stored (a member of a cluster).

Only a projection is ever taken over, moved or removed (:func:`check_state_dir`): the state
directory must be missing, empty, one of our symlinks (``<name>.gen-<digits>``), or a
directory holding nothing but what a generation holds: ``PARTITIONS`` and ``p-<N>/``
RocksDB directories (each empty or holding RocksDB's ``CURRENT``, ``IDENTITY``, ``LOCK`` or
``LOG`` file). Anything else (a regular file, a directory of other files) is refused before
anything is written, and pruning removes only siblings named and shaped like a generation.
"""

from __future__ import annotations

import os
import re
import stat
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING

from effectlog.errors import BackendUnavailable, InvalidInput
from effectlog.private_fs import make_private_dirs
from projections.checkpoint import check_partition_count

if TYPE_CHECKING:
    import logging


def _logger() -> logging.Logger:
    """This module's logger, imported on first use: read commands that never log skip the
    cost of importing :mod:`logging`."""
    import logging

    return logging.getLogger(__name__)

_GEN = ".gen-"
_NEW = ".new-"
_PARTITIONS = "PARTITIONS"
_OWN_FILE = re.compile(r"PARTITIONS|\.PARTITIONS\.\d+")  # the count and its scratch copy
_PARTITION_DIR = re.compile(r"p-\d+")
#: Files RocksDB makes in a database's directory (LOCK and LOG first, while it creates one).
_ROCKSDB_MARKERS = ("CURRENT", "IDENTITY", "LOCK", "LOG")


class NotAProjection(InvalidInput):
    """``--state`` names something other than an effectlog projection (exit 2)."""


def check_state_dir(state_dir: str | os.PathLike[str]) -> None:
    """Raise :class:`NotAProjection` when ``state_dir`` exists and is not a projection of
    ours (see the module's docstring); a missing path or an empty directory passes."""
    path = Path(state_dir)
    reason = _not_ours(path)
    if reason is not None:
        raise NotAProjection(f"--state {path} is not an effectlog projection ({reason}): "
                             "point --state at a new or empty directory")


def _not_ours(path: Path) -> str | None:
    """Why ``path`` is not a projection effectlog may use, or None when it is one (or is
    missing, or an empty directory)."""
    try:
        mode = path.lstat().st_mode
    except (FileNotFoundError, NotADirectoryError):
        return None
    if stat.S_ISLNK(mode):
        if _is_generation_name(path, os.readlink(path)):
            return None
        try:
            mode = path.stat().st_mode
        except (FileNotFoundError, NotADirectoryError):
            return f"a symlink to {os.readlink(path)}, which does not exist"
    if not stat.S_ISDIR(mode):
        return "a file, not a directory" if stat.S_ISREG(mode) else "not a directory"
    stray = _foreign_entries(path)
    if not stray:
        return None
    shown = ", ".join(sorted(stray)[:3]) + (f" and {len(stray) - 3} more" if len(stray) > 3 else "")
    return f"it holds {shown}, which a projection never does"


def _is_generation_name(path: Path, name: str) -> bool:
    """Whether ``name`` is how this module names a sibling generation of ``path``."""
    prefix = f"{path.name}{_GEN}"
    return name.startswith(prefix) and name[len(prefix):].isdigit()


def _foreign_entries(directory: Path) -> list[str]:
    """Entries of ``directory`` that no projection generation holds."""
    stray = []
    with os.scandir(directory) as entries:
        for entry in entries:
            if _OWN_FILE.fullmatch(entry.name) and entry.is_file(follow_symlinks=False):
                continue
            if _PARTITION_DIR.fullmatch(entry.name) and entry.is_dir(follow_symlinks=False) \
                    and _rocksdb_dir(Path(entry.path)):
                continue
            stray.append(entry.name)
    return stray


def _rocksdb_dir(directory: Path) -> bool:
    """A partition's directory: empty (its writer not opened yet) or a RocksDB's."""
    names = os.listdir(directory)
    return not names or any(marker in names for marker in _ROCKSDB_MARKERS)


def current_generation(state_dir: str | os.PathLike[str]) -> Path | None:
    """The directory the projection currently lives in, or None when there is none yet.

    A plain directory at ``state_dir`` (not a symlink) is accepted as a single generation.
    Raises :class:`NotAProjection` for anything at ``state_dir`` that is not a projection.
    """
    check_state_dir(state_dir)
    path = Path(state_dir)
    if path.is_symlink():
        target = path.resolve()
        return target if target.is_dir() else None
    return path if path.is_dir() else None


def ensure_generation(state_dir: str | os.PathLike[str]) -> Path:
    """The current generation, creating the first one (and the symlink) if needed."""
    found = current_generation(state_dir)
    if found is not None:
        return found
    path = Path(state_dir)
    fresh = _fresh_sibling(path, _GEN)
    try:
        os.symlink(fresh.name, path)
    except FileExistsError:  # another process created it first
        fresh.rmdir()
        found = current_generation(state_dir)
        if found is None:
            raise
        return found
    return fresh


def new_build_dir(state_dir: str | os.PathLike[str]) -> Path:
    """A fresh, empty ``<state_dir>.new-<ms>`` directory for a rebuild."""
    check_state_dir(state_dir)
    return _fresh_sibling(Path(state_dir), _NEW)


def hold(state_dir: str | os.PathLike[str], holder: str) -> IO[str]:
    """Take the state directory for ``holder`` (``effectlog serve``, ``effectlog rebuild``):
    one of them at a time, so a rebuild never swaps a projection under a serve that answers
    from it. The lock (``<state_dir>.consumers/node.lock``, flock) lasts as long as the
    returned handle is open; a directory held already raises :class:`BackendUnavailable`
    naming its holder."""
    import fcntl

    check_state_dir(state_dir)  # before the lock's directory is made beside it
    path = Path(state_dir)
    lock = path.with_name(f"{path.name}.consumers") / "node.lock"
    make_private_dirs(lock.parent)
    handle = lock.open("a+", encoding="utf-8")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        found = _holder(handle)
        handle.close()
        raise BackendUnavailable(f"state directory {state_dir} is in use by {found}") from None
    handle.truncate(0)
    handle.write(f"{holder} (pid {os.getpid()})\n")
    handle.flush()
    return handle


def _holder(handle: IO[str], within_s: float = 0.5) -> str:
    """The name the lock's holder wrote: it writes it just after taking the lock, so an empty
    file is read again for a moment before the holder is called "another process"."""
    import time

    deadline = time.monotonic() + within_s
    while True:
        handle.seek(0)
        found = handle.read().strip()
        if found or time.monotonic() >= deadline:
            return found or "another process"
        time.sleep(0.01)


def swap_in(state_dir: str | os.PathLike[str], built: Path) -> Path:
    """Make ``built`` the current generation atomically; return its final directory.

    The generation before the previous one, and abandoned ``.new-`` builds, are removed.
    """
    check_state_dir(state_dir)
    path = Path(state_dir)
    stamp = built.name[len(path.name) + len(_NEW):]
    final = _sibling(path, _GEN, int(stamp) if stamp.isdigit() else None)  # a name still free
    os.rename(built, final)
    previous = current_generation(path)
    if path.exists() and not path.is_symlink():  # legacy plain directory: move it aside
        aside = _sibling(path, _GEN)
        os.rename(path, aside)
        previous = aside
        _logger().warning("moved the plain projection directory %s to %s", path, aside)
    link = path.with_name(f".{path.name}.link-{os.getpid()}")
    if link.is_symlink():
        link.unlink()
    os.symlink(final.name, link)
    os.replace(link, path)
    _prune(path, keep={final, previous})
    return final


def partition_dir(generation: Path, partition: int) -> Path:
    return generation / f"p-{partition}"


def partitions_in(generation: Path | None) -> list[int]:
    """Partitions that have a RocksDB in ``generation``, ascending."""
    if generation is None or not generation.is_dir():
        return []
    found = []
    for child in generation.iterdir():
        name = child.name
        if name.startswith("p-") and name[2:].isdigit() and (child / "CURRENT").exists():
            found.append(int(name[2:]))
    return sorted(found)


def record_partition_count(generation: Path, count: int) -> None:
    """Remember that the events topic has ``count`` partitions (written once, atomically);
    a projection made with another count is refused (:class:`WrongLog`)."""
    target = generation / _PARTITIONS
    recorded = partition_count(generation)
    if recorded == count:
        return
    check_partition_count(recorded, count, f"the projection {generation}")
    scratch = generation / f".{_PARTITIONS}.{os.getpid()}"
    scratch.write_text(f"{count}\n", encoding="ascii")
    os.replace(scratch, target)


def partition_count(generation: Path | None) -> int | None:
    """The recorded partition count of ``generation`` (None when none is recorded)."""
    if generation is None:
        return None
    try:
        return int((generation / _PARTITIONS).read_text(encoding="ascii"))
    except (OSError, ValueError):
        return None


def _fresh_sibling(path: Path, marker: str) -> Path:
    """A new, empty, private ``<path><marker><ms>`` directory (parents made 0700 too)."""
    make_private_dirs(path.parent)
    while True:
        candidate = _sibling(path, marker)
        try:
            candidate.mkdir(mode=0o700)
        except FileExistsError:  # another process took that name in the same millisecond
            continue
        os.chmod(candidate, 0o700)
        return candidate


def _sibling(path: Path, marker: str, stamp: int | None = None) -> Path:
    """``<path><marker><ms>`` for the first millisecond from ``stamp`` (default: now) whose
    name is free."""
    if stamp is None:
        stamp = int(time.time() * 1000)
    while True:
        candidate = path.with_name(f"{path.name}{marker}{stamp}")
        if not os.path.lexists(candidate):
            return candidate
        stamp += 1


def _prune(path: Path, keep: set[Path | None]) -> None:
    """Remove the siblings of ``path`` that are generations or builds this module made
    (named ``<name>.gen-<digits>`` or ``<name>.new-<digits>``, real directories holding only
    what a generation holds), except those in ``keep``. Anything else is left alone."""
    import shutil

    kept = {p.resolve() for p in keep if p is not None}
    prefixes = (f"{path.name}{_GEN}", f"{path.name}{_NEW}")
    for old in path.parent.iterdir():
        prefix = next((p for p in prefixes if old.name.startswith(p)), None)
        if prefix is None or not old.name[len(prefix):].isdigit() or old.resolve() in kept:
            continue
        if not _generation_dir(old):
            _logger().warning("not removing %s: it is not a projection generation", old)
            continue
        _logger().info("removing old projection generation %s", old)
        shutil.rmtree(old, ignore_errors=True)


def _generation_dir(path: Path) -> bool:
    """Whether ``path`` is a real directory holding only what a generation holds."""
    try:
        return not path.is_symlink() and path.is_dir() and not _foreign_entries(path)
    except OSError:  # unreadable: not known to be ours
        return False
