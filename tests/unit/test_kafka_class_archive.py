"""The broker's class-data-sharing archive (tools/kafka/cds.py): written once by a JVM that
exits cleanly, adopted into place, then mapped by every later start; named after the Java
runtime and the jars, so other ones never map it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.kafka import cds


@pytest.fixture
def lib(tmp_path: Path) -> Path:
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "kafka.jar").write_bytes(b"jar")
    cds._archive_path.cache_clear()
    return tmp_path / "lib"


def test_the_first_start_writes_the_archive_and_later_ones_map_it(lib: Path) -> None:
    options, written = cds.jvm_options("/usr/bin/java", lib)
    assert written is not None and options == [cds.LENIENT,
                                               f"-XX:ArchiveClassesAtExit={written}"]
    written.write_bytes(b"archive")  # what the JVM does at a clean exit
    cds.adopt(written)
    options, again = cds.jvm_options("/usr/bin/java", lib)
    archive = next(lib.parent.glob("broker-*.jsa"))
    assert again is None and options == [cds.LENIENT, f"-XX:SharedArchiveFile={archive}"]
    assert not written.exists()


def test_a_killed_jvm_leaves_nothing_to_adopt(lib: Path) -> None:
    _, written = cds.jvm_options("/usr/bin/java", lib)
    cds.adopt(written)  # the JVM was SIGKILLed: it wrote nothing
    _, written = cds.jvm_options("/usr/bin/java", lib)
    assert written is not None  # the next start writes it
    assert not list(lib.parent.glob("broker-*.jsa"))


def test_other_jars_get_an_archive_of_their_own(lib: Path) -> None:
    first = cds._archive_path("/usr/bin/java", lib)
    (lib / "kafka.jar").write_bytes(b"another jar")
    cds._archive_path.cache_clear()
    assert cds._archive_path("/usr/bin/java", lib) != first


def test_a_detached_broker_or_the_switch_writes_none(lib: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    assert cds.jvm_options("/usr/bin/java", lib, write=False) == ([], None)
    monkeypatch.setenv("EFFECTLOG_KAFKA_CDS", "0")
    assert cds.jvm_options("/usr/bin/java", lib) == ([], None)
