"""Files and directories effectlog creates are private: directories 0700, files 0600.

The modes are set explicitly after creation, so they hold whatever the process umask is
(``mkdir(mode=0o700)`` alone applies only to the last directory and is masked by umask).
"""

from __future__ import annotations

import os
from pathlib import Path

DIR_MODE = 0o700
FILE_MODE = 0o600


def make_private_dirs(path: str | os.PathLike[str]) -> Path:
    """Create ``path`` and every missing parent as 0700; existing ones are left alone."""
    target = Path(path)
    missing = []
    probe = target
    while not probe.exists() and probe != probe.parent:
        missing.append(probe)
        probe = probe.parent
    for directory in reversed(missing):
        try:
            directory.mkdir(mode=DIR_MODE)
        except FileExistsError:  # another process made it meanwhile
            continue
        os.chmod(directory, DIR_MODE)
    return target


def create_private_file(path: str | os.PathLike[str]) -> bool:
    """Create ``path`` empty and 0600 unless it exists; True when this call created it."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
    except FileExistsError:
        return False
    try:
        os.fchmod(fd, FILE_MODE)
    finally:
        os.close(fd)
    return True

