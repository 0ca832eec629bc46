"""A class-data-sharing archive of the broker's classes, so that a broker starts quicker.

A JVM that maps its classes from an archive skips loading, verifying and linking the several
thousand classes of a Kafka broker from the jars: on the reference machine a broker answers
after 3.5 CPU-seconds instead of 7.1 (3.4 s instead of 6.0 s of wall time). The test suite
starts dozens of brokers (restarts, kills, clusters), so this is minutes of CPU.

The first broker started without an archive writes one when it exits cleanly
(``-XX:ArchiveClassesAtExit``), to a file of its own that :func:`adopt` then moves into place;
every later start maps it (``-XX:SharedArchiveFile``). The archive's name carries what it
depends on (the Java runtime, the jars), so another JDK or other jars write their own. A JVM
that cannot use an archive warns in the broker log and starts as it would without one;
``EFFECTLOG_KAFKA_CDS=0`` leaves the archive out altogether.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import uuid
from pathlib import Path

#: JVM options a JDK that does not know the archive options ignores (before JDK 13).
LENIENT = "-XX:+IgnoreUnrecognizedVMOptions"


def jvm_options(java: str, lib: Path, *, write: bool = True) -> tuple[list[str], Path | None]:
    """The options of a broker JVM started from ``java`` with the jars of ``lib``, and the
    file that JVM writes an archive to at a clean exit (None: it maps the existing one, or
    none; ``write``: it may write one), to :func:`adopt` once it has exited."""
    if os.environ.get("EFFECTLOG_KAFKA_CDS", "1") == "0":
        return [], None
    archive = _archive_path(java, lib)
    if archive.exists():
        return [LENIENT, f"-XX:SharedArchiveFile={archive}"], None
    if not write:
        return [], None
    written = archive.with_name(f"{archive.name}.{uuid.uuid4().hex[:8]}.tmp")
    return [LENIENT, f"-XX:ArchiveClassesAtExit={written}"], written


def adopt(written: Path | None) -> None:
    """Move an archive a JVM wrote at its exit into place (a JVM that was killed wrote
    none; of two written at once, either serves)."""
    if written is None:
        return
    with contextlib.suppress(OSError):
        if written.stat().st_size > 0:
            os.replace(written, _final(written))
    with contextlib.suppress(OSError):
        written.unlink()


def _final(written: Path) -> Path:
    return written.with_name(written.name.split(".", 1)[0] + ".jsa")


@functools.lru_cache(maxsize=4)
def _archive_path(java: str, lib: Path) -> Path:
    digest = hashlib.sha256()
    for path in [Path(java).resolve(), *sorted(lib.glob("*.jar"))]:
        with contextlib.suppress(OSError):
            status = path.stat()
            digest.update(f"{path}:{status.st_size}:{status.st_mtime_ns}\n".encode())
    return lib.parent / f"broker-{digest.hexdigest()[:16]}.jsa"
