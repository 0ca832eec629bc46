"""Kafka's jars from Maven Central, checked against a committed lock: no Maven needed.

``tools/kafka/jars.lock`` names every jar of the broker and its tools (``group:artifact:version``
and, where there is one, ``:classifier``) with its SHA-256. :func:`install` downloads each from
Maven Central (``$EFFECTLOG_MAVEN_REPO`` points elsewhere, e.g. a mirror), refuses a jar whose
sum differs, and moves the set into place only when all of it is there. ``python -m tools.kafka
lock`` writes the lock again from ``tools/kafka/pom.xml`` (that one step uses Maven).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

LOCK = Path(__file__).with_name("jars.lock")
POM = Path(__file__).with_name("pom.xml")
CENTRAL = "https://repo1.maven.org/maven2"
_CHUNK = 1 << 16


class JarsError(RuntimeError):
    """A jar could not be fetched, or did not match its locked SHA-256."""


@dataclass(frozen=True, slots=True)
class Jar:
    """One locked jar: Maven coordinates and the SHA-256 of its bytes."""

    group: str
    artifact: str
    version: str
    classifier: str
    sha256: str

    @property
    def filename(self) -> str:
        tail = f"-{self.classifier}" if self.classifier else ""
        return f"{self.artifact}-{self.version}{tail}.jar"

    @property
    def path(self) -> str:
        """Its path in a Maven repository."""
        return f"{self.group.replace('.', '/')}/{self.artifact}/{self.version}/{self.filename}"

    def line(self) -> str:
        coordinates = ":".join(filter(None, (self.group, self.artifact, self.version,
                                             self.classifier)))
        return f"{coordinates} {self.sha256}"


def parse_lock(text: str) -> tuple[str, list[Jar]]:
    """What the lock was written for (``kafka 4.1.1``), and its jars."""
    version, jars = "", []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if line.startswith("# lock: "):
            version = line[len("# lock: "):].strip()
        if not line or line.startswith("#"):
            continue
        coordinates, _, digest = line.partition(" ")
        parts = coordinates.split(":")
        if len(parts) not in (3, 4) or len(digest) != 64:
            raise JarsError(f"lock line {number}: expected group:artifact:version[:classifier] "
                            "SHA256")
        group, artifact, jar_version, *classifier = parts
        jars.append(Jar(group, artifact, jar_version, classifier[0] if classifier else "", digest))
    return version, jars


def read_lock(label: str, lock: Path = LOCK) -> list[Jar]:
    """The locked jars, refused when the lock was written for something else than ``label``
    (``kafka 4.1.1``: another version in pom.xml)."""
    found, jars = parse_lock(lock.read_text())
    if found != label:
        raise JarsError(f"{lock} is for {found or '?'}, its pom.xml for {label}: write it "
                        "again with `python -m tools.kafka lock`")
    return jars


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        while chunk := stream.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _download(url: str, target: Path, timeout_s: float) -> None:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as answer, target.open("wb") as out:
            shutil.copyfileobj(answer, out, _CHUNK)
    except (urllib.error.URLError, OSError) as exc:
        raise JarsError(f"cannot fetch {url}: {exc}") from None


def install(lib: Path, jars: list[Jar], repo: str | None = None,
            timeout_s: float = 60.0) -> None:
    """Download ``jars`` into ``lib`` (replacing it), each checked against its SHA-256."""
    base = (repo or os.environ.get("EFFECTLOG_MAVEN_REPO") or CENTRAL).rstrip("/")
    lib.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix="lib-", dir=lib.parent))
    try:
        log.info("fetching %d jars from %s into %s", len(jars), base, lib)
        for jar in jars:
            target = staging / jar.filename
            _download(f"{base}/{jar.path}", target, timeout_s)
            found = _sha256(target)
            if found != jar.sha256:
                raise JarsError(f"{jar.filename} from {base} has SHA-256 {found}, the lock "
                                f"says {jar.sha256}: refused")
        (staging / ".complete").write_text("\n".join(j.line() for j in jars) + "\n")
        shutil.rmtree(lib, ignore_errors=True)
        staging.rename(lib)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def write_lock(label: str, lock: Path = LOCK, pom: Path = POM) -> int:
    """Resolve ``pom`` with Maven (the one step that needs it) and write the lock; the number
    of jars locked."""
    mvn = shutil.which("mvn")
    if mvn is None:
        raise JarsError("writing the lock resolves pom.xml with Maven: apt-get install maven")
    with tempfile.TemporaryDirectory() as tmp:
        result = subprocess.run(
            [mvn, "-q", "-B", "-f", str(pom), "dependency:copy-dependencies",
             "-DincludeScope=runtime", "-Dmdep.useRepositoryLayout=true",
             f"-DoutputDirectory={tmp}"], capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise JarsError(f"mvn could not resolve {pom}: {(result.stdout + result.stderr)[-1500:]}")
        jars = []
        for path in sorted(Path(tmp).rglob("*.jar")):
            version_dir = path.parent
            artifact, version = version_dir.parent.name, version_dir.name
            group = version_dir.parent.parent.relative_to(tmp).as_posix().replace("/", ".")
            stem = path.name[:-len(".jar")]
            classifier = stem[len(f"{artifact}-{version}-"):] if stem != f"{artifact}-{version}" else ""
            jars.append(Jar(group, artifact, version, classifier, _sha256(path)))
    header = (f"# lock: {label}\n"
              f"# The jars of {pom.parent.name}/pom.xml with their SHA-256, fetched from Maven\n"
              "# Central by tools/kafka/jars.py. Written by `python -m tools.kafka lock`.\n")
    lock.write_text(header + "".join(f"{jar.line()}\n" for jar in jars))
    return len(jars)
